"""What runs inside the user's process: the options handed to a run, its preparation, drift's factor levels, capture that follows the ranks a framework launches, the start-up hook."""
