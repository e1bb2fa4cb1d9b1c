"""In-process observers. They only watch and append events: no RNG draws, no graph breaks,
no recompiles, no device syncs beyond those a step boundary already has."""
