/* The step stream codec of steps.bin in C: the same format as eventlog/stepstream.py, byte for byte
 * (that module's docstring is the specification, its pure-Python Encoding and Records the reference
 * this file must agree with: tests/unit/test_step_codec.py compares the two on generated values and on
 * damaged bytes).
 *
 * Why: a record costs ~12-21 us to decode and ~7-49 us to encode in Python; here ~1 us, most of it
 * building the Step event (a Python callable the decoder calls with the record's values).
 *
 * Safety: a decoder reads files it did not write. Every read is checked against the record's end; a
 * read past it fails as Python's does ("index out of range"), a slice past it is cut short as a Python
 * slice is, so damage is counted and described exactly as the reference does. No allocation is sized
 * by a number read from the file (a list's count is read item by item, each at least its tag byte),
 * values nest at most MAX_DEPTH deep, a list or dict "changed with no item changed" is the previous
 * one (shared), and the items of changed ones count against a budget of BUDGET_PER_BYTE a byte of
 * the file. A record's check (CRC-32, chained) is verified before anything in it is decoded; runs
 * of zero bytes are passed at memchr's speed while seeking a keyframe.
 *
 * VERSION changes whenever this file changes what it reads or writes: stepstream.py uses the
 * extension only when the VERSION it was built with is the one it expects (a stale build is ignored).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define VERSION 2
#define KEYFRAME_EVERY 256
#define MAX_RECORD (16 << 20)
#define MAX_DEPTH 100
#define BUDGET_PER_BYTE 16 /* items of changed lists and dicts decoded per byte of the file, and FREE_ITEMS more */
#define FREE_ITEMS (1 << 20)
static const unsigned char KEYFRAME[4] = {0, 'T', 'R', 'K'};

typedef unsigned __int128 u128;
typedef __int128 i128;

/* ---------------------------------------------------------------- shared helpers */

static int damaged(const char *format, ...) {
    va_list args;
    va_start(args, format);
    PyErr_FormatV(PyExc_ValueError, format, args);
    va_end(args);
    return -1;
}

static uint64_t float_bits(double f) {
    uint64_t x;
    memcpy(&x, &f, 8);
    return x;
}

static double bits_float(uint64_t x) {
    double f;
    memcpy(&f, &x, 8);
    return f;
}

/* CRC-32 (zlib's: Python's zlib.crc32(data, value)) */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n, uint32_t value) {
    uint32_t c = ~value;
    for (Py_ssize_t k = 0; k < n; k++) c = crc_table[(c ^ p[k]) & 0xFF] ^ (c >> 8);
    return ~c;
}

/* f in whole microseconds when it is exactly the float nearest such a number (stepstream._micros) */
static int micros(double f, long long *m) {
    if (!(f > -1e9 && f < 1e9)) return 0;
    double r = nearbyint(f * 1e6); /* round half to even, as Python's round() */
    long long v = (long long)r;
    if ((double)v / 1e6 != f || (v == 0 && signbit(f))) return 0;
    *m = v;
    return 1;
}

static int old_micros(PyObject *old, long long *m) {
    *m = 0;
    if (old != NULL && PyFloat_CheckExact(old)) micros(PyFloat_AS_DOUBLE(old), m);
    return 0;
}

static PyObject *long_from_i128(i128 v) {
    if (v >= LLONG_MIN && v <= LLONG_MAX) return PyLong_FromLongLong((long long)v);
    u128 u = v < 0 ? -(u128)v : (u128)v;
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(u >> 64));
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)u);
    PyObject *shift = PyLong_FromLong(64);
    PyObject *high = NULL, *sum = NULL, *out = NULL;
    if (hi && lo && shift && (high = PyNumber_Lshift(hi, shift)) && (sum = PyNumber_Or(high, lo)))
        out = v < 0 ? PyNumber_Negative(sum) : (Py_INCREF(sum), sum);
    Py_XDECREF(hi);
    Py_XDECREF(lo);
    Py_XDECREF(shift);
    Py_XDECREF(high);
    Py_XDECREF(sum);
    return out;
}

/* ---------------------------------------------------------------- encoding */

typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
    unsigned char small[256];
} Out;

static void out_init(Out *o) {
    o->p = o->small;
    o->len = 0;
    o->cap = sizeof o->small;
}

static void out_free(Out *o) {
    if (o->p != o->small) PyMem_Free(o->p);
}

static int put(Out *o, const void *data, Py_ssize_t n) {
    if (o->len + n > o->cap) {
        Py_ssize_t cap = o->cap * 2;
        while (cap < o->len + n) cap *= 2;
        unsigned char *p = PyMem_Malloc(cap);
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(p, o->p, o->len);
        out_free(o);
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->len, data, n);
    o->len += n;
    return 0;
}

static int put1(Out *o, unsigned char b) { return put(o, &b, 1); }

static int put_varint(Out *o, unsigned long long n) {
    unsigned char t[10];
    int k = 0;
    while (n > 0x7F) {
        t[k++] = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    t[k++] = (unsigned char)n;
    return put(o, t, k);
}

static unsigned long long zigzag(long long n) { return ((unsigned long long)n << 1) ^ (unsigned long long)(n >> 63); }

/* the varint of the number whose bit j is set when bits[j] is (a record's or a list's mask) */
static int put_bits(Out *o, const char *bits, Py_ssize_t n) {
    Py_ssize_t top = n;
    while (top > 0 && !bits[top - 1]) top--;
    if (top == 0) return put1(o, 0);
    for (Py_ssize_t j = 0; j < top; j += 7) {
        unsigned char b = 0;
        for (int k = 0; k < 7 && j + k < top; k++)
            if (bits[j + k]) b |= (unsigned char)(1 << k);
        if (j + 7 < top) b |= 0x80;
        if (put1(o, b)) return -1;
    }
    return 0;
}

/* the varint of the zigzag of a Python int of any size */
static int put_zigzag(Out *o, PyObject *n) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (!overflow) return put_varint(o, zigzag(v));
    PyObject *one = PyLong_FromLong(1), *seven = PyLong_FromLong(7), *low7 = PyLong_FromLong(0x7F);
    PyObject *z = NULL, *twice = one ? PyNumber_Lshift(n, one) : NULL;
    int rc = -1;
    if (twice && seven && low7) z = overflow < 0 ? PyNumber_Invert(twice) : (Py_INCREF(twice), twice);
    while (z != NULL) { /* z > 2**63: 7 bits at a time */
        PyObject *low = PyNumber_And(z, low7), *rest = PyNumber_Rshift(z, seven);
        Py_DECREF(z);
        z = rest;
        if (low == NULL || rest == NULL) {
            Py_XDECREF(low);
            break;
        }
        long b = PyLong_AsLong(low);
        Py_DECREF(low);
        int more = PyObject_IsTrue(rest);
        if (put1(o, (unsigned char)(b | (more ? 0x80 : 0)))) break;
        if (!more) {
            rc = 0;
            break;
        }
    }
    Py_XDECREF(z);
    Py_XDECREF(twice);
    Py_XDECREF(one);
    Py_XDECREF(seven);
    Py_XDECREF(low7);
    return rc;
}

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;       /* fields, _lines first */
    PyObject **prev;    /* the previous record's values; NULL: none (a keyframe's) */
    PyObject **delta;   /* each int field's previous change; NULL: 0 */
    char *mask;         /* the current record's fields written */
    PyObject *strings;  /* str -> its index in the string table */
    Py_ssize_t records;
    int key_next, depth, checked;
    uint32_t chain; /* the check of the record before */
} Encoding;

static void encoding_reset(Encoding *self) {
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Py_CLEAR(self->prev[i]);
        Py_CLEAR(self->delta[i]);
    }
    PyDict_Clear(self->strings);
}

static int encode_value(Encoding *self, PyObject *v, PyObject *old, Out *o);

/* "item changed": not the previous one, nor equal to it of the same type (a zero float is written
 * again: 0.0 == -0.0) */
static int changed(PyObject *v, PyObject *old) {
    if (old == NULL) return 1;
    if (v == old) return 0;
    int ne = PyObject_RichCompareBool(v, old, Py_NE);
    if (ne != 0) return ne;
    return Py_TYPE(v) != Py_TYPE(old) || (PyFloat_CheckExact(v) && PyFloat_AS_DOUBLE(v) == 0.0);
}

static int encode_float(PyObject *v, PyObject *old, Out *o) {
    double f = PyFloat_AS_DOUBLE(v);
    long long m, base;
    if (micros(f, &m)) {
        old_micros(old, &base);
        return put1(o, 0x04) || put_varint(o, zigzag(m - base));
    }
    uint64_t x = float_bits(f);
    if (old != NULL && PyFloat_CheckExact(old)) x ^= float_bits(PyFloat_AS_DOUBLE(old));
    int tz = 7, nb = 1;
    if (x) {
        tz = __builtin_ctzll(x) >> 3;
        int bytes = (64 - __builtin_clzll(x) + 7) >> 3;
        nb = (bytes > tz + 1 ? bytes : tz + 1) - tz;
    }
    unsigned char t[9];
    t[0] = (unsigned char)(0x40 | tz << 3 | (nb - 1));
    for (int k = 0; k < nb; k++) t[1 + k] = (unsigned char)(x >> (8 * (tz + k)));
    return put(o, t, 1 + nb);
}

static int hex_digit(Py_UCS1 c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

static int encode_str(Encoding *self, PyObject *s, Out *o) {
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_IS_ASCII(s) && len > 0 && len <= 126 && len % 2 == 0) { /* a fingerprint: its bytes */
        const Py_UCS1 *c = PyUnicode_1BYTE_DATA(s);
        unsigned char t[64];
        Py_ssize_t k = 0;
        t[0] = (unsigned char)(0x80 | len / 2);
        for (; k < len; k += 2) {
            int hi = hex_digit(c[k]), lo = hex_digit(c[k + 1]);
            if (hi < 0 || lo < 0) break;
            t[1 + k / 2] = (unsigned char)(hi << 4 | lo);
        }
        if (k == len) return put(o, t, 1 + len / 2);
    }
    PyObject *index = PyDict_GetItemWithError(self->strings, s);
    if (index != NULL) return put1(o, 0xC1) || put_varint(o, (unsigned long long)PyLong_AsSsize_t(index));
    if (PyErr_Occurred()) return -1;
    Py_ssize_t size;
    const char *data = PyUnicode_AsUTF8AndSize(s, &size);
    if (data == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            PyErr_SetString(PyExc_TypeError, "a str that UTF-8 cannot encode (a lone surrogate)");
        }
        return -1;
    }
    PyObject *next = PyLong_FromSsize_t(PyDict_GET_SIZE(self->strings));
    int rc = next == NULL || PyDict_SetItem(self->strings, s, next) || put1(o, 0xC0) || put_varint(o, size) ||
             put(o, data, size);
    Py_XDECREF(next);
    return rc ? -1 : 0;
}

/* tag, the mask of the items of `items` that changed from `olds` (position by position), their values */
static int encode_changes(Encoding *self, unsigned char tag, PyObject *items, PyObject *olds, Out *o) {
    Py_ssize_t n = PyList_GET_SIZE(items) < PyList_GET_SIZE(olds) ? PyList_GET_SIZE(items) : PyList_GET_SIZE(olds);
    char *bits = PyMem_Calloc(n ? n : 1, 1);
    if (bits == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Out body;
    out_init(&body);
    int rc = 0;
    for (Py_ssize_t j = 0; rc == 0 && j < n && j < PyList_GET_SIZE(items) && j < PyList_GET_SIZE(olds); j++) {
        PyObject *item = PyList_GET_ITEM(items, j), *old = PyList_GET_ITEM(olds, j);
        Py_INCREF(item);
        Py_INCREF(old);
        int c = changed(item, old);
        if (c < 0) rc = -1;
        else if (c) {
            bits[j] = 1;
            rc = encode_value(self, item, old, &body);
        }
        Py_DECREF(item);
        Py_DECREF(old);
    }
    if (rc == 0) rc = put1(o, tag) || put_bits(o, bits, n) || put(o, body.p, body.len) ? -1 : 0;
    out_free(&body);
    PyMem_Free(bits);
    return rc;
}

static int encode_list(Encoding *self, PyObject *v, PyObject *old, Out *o) {
    if (old != NULL && PyList_CheckExact(old) && PyList_GET_SIZE(old) == PyList_GET_SIZE(v))
        return encode_changes(self, 0xC4, v, old, o);
    Py_ssize_t n = PyList_GET_SIZE(v);
    if (put1(o, 0xC2) || put_varint(o, n)) return -1;
    for (Py_ssize_t j = 0; j < n; j++) /* (nothing here runs Python code that could change the list) */
        if (encode_value(self, PyList_GET_ITEM(v, j), NULL, o)) return -1;
    return 0;
}

static int encode_dict(Encoding *self, PyObject *v, PyObject *old, Out *o) {
    if (old != NULL && PyDict_CheckExact(old) && PyDict_GET_SIZE(old) == PyDict_GET_SIZE(v)) {
        PyObject *keys = PyDict_Keys(v), *old_keys = PyDict_Keys(old);
        int same = keys && old_keys ? PyObject_RichCompareBool(old_keys, keys, Py_EQ) : -1;
        Py_XDECREF(keys);
        Py_XDECREF(old_keys);
        if (same < 0) return -1;
        if (same) {
            PyObject *values = PyDict_Values(v), *old_values = PyDict_Values(old);
            int rc = values && old_values ? encode_changes(self, 0xC5, values, old_values, o) : -1;
            Py_XDECREF(values);
            Py_XDECREF(old_values);
            return rc;
        }
    }
    if (put1(o, 0xC3) || put_varint(o, PyDict_GET_SIZE(v))) return -1;
    Py_ssize_t at = 0;
    PyObject *key, *item;
    while (PyDict_Next(v, &at, &key, &item)) {
        if (!PyUnicode_CheckExact(key)) {
            PyErr_Format(PyExc_TypeError, "dict key %R", key);
            return -1;
        }
        if (encode_str(self, key, o) || encode_value(self, item, NULL, o)) return -1;
    }
    return 0;
}

/* one value, its tag first (Encoder._value) */
static int encode_value(Encoding *self, PyObject *v, PyObject *old, Out *o) {
    if (v == Py_None) return put1(o, 0x00);
    if (PyBool_Check(v)) return put1(o, v == Py_True ? 0x02 : 0x01);
    if (PyLong_CheckExact(v)) return put1(o, 0x03) || put_zigzag(o, v);
    if (PyFloat_CheckExact(v)) return encode_float(v, old, o);
    if (PyUnicode_CheckExact(v)) return encode_str(self, v, o);
    int list = PyList_CheckExact(v);
    if (list || PyDict_CheckExact(v)) {
        if (self->depth >= MAX_DEPTH) {
            PyErr_Format(PyExc_TypeError, "a value nested over %d deep", MAX_DEPTH);
            return -1;
        }
        self->depth++;
        int rc = list ? encode_list(self, v, old, o) : encode_dict(self, v, old, o);
        self->depth--;
        return rc;
    }
    PyObject *name = PyObject_GetAttrString((PyObject *)Py_TYPE(v), "__name__");
    if (name != NULL) {
        PyErr_Format(PyExc_TypeError, "%S in a step record", name);
        Py_DECREF(name);
    }
    return -1;
}

/* an int field: its change, less the previous change (no bit when that is 0) */
static int encode_int_change(Encoding *self, Py_ssize_t i, PyObject *v, PyObject *old, Out *o) {
    long long a, b, d = 0, c, e;
    int oa, ob, od = 0;
    a = PyLong_AsLongLongAndOverflow(v, &oa);
    b = PyLong_AsLongLongAndOverflow(old, &ob);
    if (self->delta[i] != NULL) d = PyLong_AsLongLongAndOverflow(self->delta[i], &od);
    if (!oa && !ob && !od && !__builtin_sub_overflow(a, b, &c) && !__builtin_sub_overflow(c, d, &e)) {
        if (e == 0) return 0;
        PyObject *change = PyLong_FromLongLong(c);
        if (change == NULL) return -1;
        Py_XSETREF(self->delta[i], c ? change : (Py_DECREF(change), NULL));
        self->mask[i] = 1;
        return put1(o, 0x03) || put_varint(o, zigzag(e));
    }
    PyObject *change = PyNumber_Subtract(v, old), *zero = PyLong_FromLong(0);
    PyObject *surprise = change && zero ? PyNumber_Subtract(change, self->delta[i] ? self->delta[i] : zero) : NULL;
    int rc = -1;
    if (surprise != NULL) {
        int moved = PyObject_IsTrue(surprise);
        if (moved == 0) rc = 0;
        else if (moved > 0) {
            self->mask[i] = 1;
            int nonzero = PyObject_IsTrue(change);
            Py_XSETREF(self->delta[i], nonzero ? (Py_INCREF(change), change) : NULL);
            rc = put1(o, 0x03) || put_zigzag(o, surprise) ? -1 : 0;
        }
    }
    Py_XDECREF(change);
    Py_XDECREF(zero);
    Py_XDECREF(surprise);
    return rc;
}

static int encoding_body(Encoding *self, PyObject *const *values, Out *body) {
    for (Py_ssize_t i = 0; i < self->n; i++) {
        PyObject *v = values[i], *old = self->prev[i];
        int rc = 0;
        Py_XINCREF(old);
        if (PyLong_CheckExact(v) && old != NULL && PyLong_CheckExact(old)) rc = encode_int_change(self, i, v, old, body);
        else if ((rc = changed(v, old)) > 0) {
            self->mask[i] = 1;
            rc = encode_value(self, v, old, body);
            Py_CLEAR(self->delta[i]);
        }
        Py_XDECREF(old);
        if (rc < 0) return -1;
        Py_INCREF(v);
        Py_XSETREF(self->prev[i], v);
    }
    return 0;
}

static PyObject *encoding_encode(Encoding *self, PyObject *values) {
    if (self->strings == NULL) return PyErr_Format(PyExc_ValueError, "an Encoding not initialised");
    PyObject *seq = PySequence_Tuple(values); /* (a copy: comparing values runs Python code) */
    if (seq == NULL) return NULL;
    if (PyTuple_GET_SIZE(seq) != self->n) {
        PyErr_Format(PyExc_ValueError, "%zd values for a record of %zd fields", PyTuple_GET_SIZE(seq), self->n);
        Py_DECREF(seq);
        return NULL;
    }
    int key = self->key_next || self->records % KEYFRAME_EVERY == 0;
    if (key) encoding_reset(self);
    memset(self->mask, 0, self->n);
    self->depth = 0;
    self->key_next = 1; /* until the record is whole: state that holds part of a record is never used */
    Out body, out;
    out_init(&body);
    out_init(&out);
    PyObject *record = NULL;
    if (encoding_body(self, &PyTuple_GET_ITEM(seq, 0), &body) == 0) {
        Py_ssize_t top = self->n;
        while (top > 0 && !self->mask[top - 1]) top--;
        int rc;
        if (top <= 7 && body.len < 0x7F && !key) { /* most records: length and mask one byte each */
            unsigned char head[2] = {(unsigned char)(body.len + 1), 0};
            for (Py_ssize_t i = 0; i < top; i++) head[1] |= (unsigned char)(self->mask[i] << i);
            rc = put(&out, head, 2) || put(&out, body.p, body.len);
        } else {
            Out head;
            out_init(&head);
            unsigned char follows[4] = {(unsigned char)self->chain, (unsigned char)(self->chain >> 8),
                                        (unsigned char)(self->chain >> 16), (unsigned char)(self->chain >> 24)};
            rc = put_bits(&head, self->mask, self->n) || (key && put(&out, KEYFRAME, 4)) ||
                 (key && self->checked && put(&out, follows, 4)) ||
                 put_varint(&out, head.len + body.len) || put(&out, head.p, head.len) || put(&out, body.p, body.len);
            out_free(&head);
        }
        uint32_t chain = self->chain;
        if (rc == 0 && self->checked) { /* the check: CRC-32 chained from the record before's, its low byte */
            chain = crc32_of(out.p, out.len, key ? 0 : self->chain);
            rc = put1(&out, (unsigned char)chain);
        }
        if (rc == 0 && (record = PyBytes_FromStringAndSize((char *)out.p, out.len)) != NULL) self->chain = chain;
    }
    out_free(&body);
    out_free(&out);
    Py_DECREF(seq);
    if (record != NULL) {
        self->key_next = 0;
        self->records++;
    }
    return record;
}

static int encoding_init(Encoding *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"nfields", "checked", NULL};
    Py_ssize_t n;
    int checked = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|p", names, &n, &checked)) return -1;
    if (n < 1 || self->prev != NULL) {
        PyErr_SetString(PyExc_ValueError, "a record has at least one field (and an Encoding is made once)");
        return -1;
    }
    self->prev = PyMem_Calloc(n, sizeof(PyObject *));
    self->delta = PyMem_Calloc(n, sizeof(PyObject *));
    self->mask = PyMem_Calloc(n, 1);
    self->strings = PyDict_New();
    if (!self->prev || !self->delta || !self->mask || !self->strings) {
        PyErr_NoMemory();
        return -1;
    }
    self->n = n;
    self->key_next = 1;
    self->checked = checked;
    return 0;
}

static void encoding_dealloc(Encoding *self) {
    if (self->prev != NULL && self->delta != NULL) encoding_reset(self);
    PyMem_Free(self->prev);
    PyMem_Free(self->delta);
    PyMem_Free(self->mask);
    Py_XDECREF(self->strings);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef encoding_methods[] = {
    {"encode", (PyCFunction)encoding_encode, METH_O, "One record of the values (_lines first), as bytes."},
    {NULL},
};

static PyMemberDef encoding_members[] = {
    {"records", T_PYSSIZET, offsetof(Encoding, records), READONLY, "records encoded"},
    {"chain", T_UINT, offsetof(Encoding, chain), READONLY, "the CRC-32 the records written end with"},
    {NULL},
};

static PyTypeObject EncodingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "torchrepro.eventlog._stepcodec.Encoding",
    .tp_doc = "Encoding(nfields, checked=True): the encoder's state for one stream (stepstream._Encoding in C).",
    .tp_basicsize = sizeof(Encoding),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)encoding_init,
    .tp_dealloc = (destructor)encoding_dealloc,
    .tp_methods = encoding_methods,
    .tp_members = encoding_members,
};

/* ---------------------------------------------------------------- decoding */

/* a record's bytes; pos may run past end as a Python index does: a read there fails, a slice there
 * is empty (any pos past end behaves as end + 1, so it is kept there) */
typedef struct {
    const unsigned char *p;
    Py_ssize_t pos, end;
} Rd;

static void skip(Rd *r, u128 size) {
    r->pos = size > (u128)(r->end - r->pos) ? r->end + 1 : r->pos + (Py_ssize_t)size;
}

static Py_ssize_t room(Rd *r, Py_ssize_t size) { /* the bytes of a slice of `size` at pos */
    Py_ssize_t left = r->end - r->pos;
    return left <= 0 ? 0 : size < left ? size : left;
}

static int read_byte(Rd *r, int *b) {
    if (r->pos >= r->end) {
        PyErr_SetString(PyExc_IndexError, "index out of range");
        return -1;
    }
    *b = r->p[r->pos++];
    return 0;
}

/* a varint of at most limit // 7 + 1 bytes (stepstream._read_varint); its bytes are `bits` */
typedef struct {
    const unsigned char *p;
    Py_ssize_t len;
} Bits;

static int read_bits(Rd *r, Py_ssize_t limit, Bits *m) {
    Py_ssize_t shift = 0, start = r->pos;
    for (;;) {
        int b;
        if (read_byte(r, &b)) return -1;
        if (b < 0x80) break;
        shift += 7;
        if (shift > limit) return damaged("a varint of over %zd bytes", limit / 7 + 1);
    }
    m->p = r->p + start;
    m->len = r->pos - start;
    return 0;
}

static int read_varint(Rd *r, u128 *n) {
    Bits m = {NULL, 0};
    if (read_bits(r, 70, &m)) return -1;
    *n = 0;
    for (Py_ssize_t k = 0; k < m.len; k++) *n |= (u128)(m.p[k] & 0x7F) << (7 * k);
    return 0;
}

static i128 unzigzag(u128 z) { return (i128)(z >> 1) ^ -(i128)(z & 1); }

static int bit(const Bits *m, Py_ssize_t j) { return j / 7 < m->len && (m->p[j / 7] >> (j % 7)) & 1; }

static int beyond(const Bits *m, Py_ssize_t n) { /* a bit set at n or above */
    for (Py_ssize_t k = n / 7; k < m->len; k++) {
        int b = m->p[k] & 0x7F;
        if (k == n / 7) b &= 0x7F << (n % 7);
        if (b) return 1;
    }
    return 0;
}

static int all(const Bits *m, Py_ssize_t n) {
    if (beyond(m, n)) return 0;
    for (Py_ssize_t j = 0; j < n; j++)
        if (!bit(m, j)) return 0;
    return 1;
}

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;       /* fields, _lines first; 0: a stream nothing of which can be read */
    PyObject *build;    /* the event of a record's values (all but _lines) */
    PyObject **prev;    /* NULL: none yet */
    PyObject **delta;   /* each int field's change in the record before; NULL: 0 */
    PyObject *strings;  /* the string table: a list */
    PyObject *buf;      /* bytes fed and not yet decoded (a record cut at the end of a piece) */
    PyObject *problems;
    Py_ssize_t damaged;
    char truncated;
    int fresh, seeking, depth, checked;
    long long at;            /* the file's byte that buf starts at */
    long long items, budget; /* items of changed lists and dicts decoded, and how many may be */
    uint32_t chain;          /* the check of the record before */
    uint32_t follows;        /* the check the records read end with, when follows_known (not after damage) */
    int follows_known;
    Py_ssize_t since_key;    /* records read since the last keyframe mark, the keyframe's own included */
} Records;

static void records_reset(Records *self) {
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Py_CLEAR(self->prev[i]);
        Py_CLEAR(self->delta[i]);
    }
    PyList_SetSlice(self->strings, 0, PyList_GET_SIZE(self->strings), NULL);
    self->fresh = 1;
    self->chain = 0;
    self->since_key = 0;
}

static PyObject *decode_value(Records *self, Rd *r, int tag, PyObject *old);

static PyObject *decode_tagged(Records *self, Rd *r, PyObject *old) {
    int tag;
    return read_byte(r, &tag) ? NULL : decode_value(self, r, tag, old);
}

static PyObject *decode_list(Records *self, Rd *r) {
    u128 count;
    if (read_varint(r, &count)) return NULL;
    PyObject *out = PyList_New(0);
    for (u128 k = 0; out != NULL && k < count; k++) { /* each item at least a byte: the record bounds it */
        PyObject *item = decode_tagged(self, r, NULL);
        if (item == NULL || PyList_Append(out, item)) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
}

static PyObject *decode_dict(Records *self, Rd *r) {
    u128 count;
    if (read_varint(r, &count)) return NULL;
    PyObject *out = PyDict_New();
    for (u128 k = 0; out != NULL && k < count; k++) {
        PyObject *key = decode_tagged(self, r, NULL), *item = NULL;
        if (key != NULL && !PyUnicode_CheckExact(key)) damaged("a dict key that is no string");
        else if (key != NULL) item = decode_tagged(self, r, NULL);
        if (item == NULL || PyDict_SetItem(out, key, item)) Py_CLEAR(out);
        Py_XDECREF(key);
        Py_XDECREF(item);
    }
    return out;
}

/* a list or dict of the previous one's length (keys): the items whose bit is set, read against the
 * previous item */
static PyObject *decode_changes(Records *self, Rd *r, PyObject *old, int keyed) {
    if (old == NULL || !(keyed ? PyDict_CheckExact(old) : PyList_CheckExact(old))) {
        damaged("a change to a value that is not there");
        return NULL;
    }
    Py_ssize_t n = keyed ? PyDict_GET_SIZE(old) : PyList_GET_SIZE(old);
    Bits m = {NULL, 0};
    if (read_bits(r, n + 70, &m)) return NULL;
    if (beyond(&m, n)) return damaged("an item beyond the previous value's"), NULL;
    int any = 0;
    for (Py_ssize_t k = 0; k < m.len; k++) any |= m.p[k] & 0x7F;
    if (!any) { /* the same value: shared, not copied (a byte may not make n items) */
        Py_INCREF(old);
        return old;
    }
    self->items += n;
    if (self->items > self->budget) return damaged("changed lists of over %d items a byte of the log", BUDGET_PER_BYTE), NULL;
    PyObject *out = keyed ? PyDict_Values(old) : PyList_GetSlice(old, 0, PyList_GET_SIZE(old));
    if (out == NULL) return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!bit(&m, j)) continue;
        PyObject *item = decode_tagged(self, r, PyList_GET_ITEM(out, j));
        if (item == NULL) goto fail;
        PyList_SetItem(out, j, item);
    }
    if (keyed) {
        PyObject *dict = PyDict_New(), *key, *item;
        Py_ssize_t at = 0, j = 0;
        while (dict != NULL && PyDict_Next(old, &at, &key, &item) && j < n)
            if (PyDict_SetItem(dict, key, PyList_GET_ITEM(out, j++))) Py_CLEAR(dict);
        Py_DECREF(out);
        return dict;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *decode_value(Records *self, Rd *r, int tag, PyObject *old) {
    u128 z;
    switch (tag) {
    case 0x00:
        Py_RETURN_NONE;
    case 0x01:
        Py_RETURN_FALSE;
    case 0x02:
        Py_RETURN_TRUE;
    case 0x03:
        return read_varint(r, &z) ? NULL : long_from_i128(unzigzag(z));
    case 0x04: {
        long long base;
        if (read_varint(r, &z)) return NULL;
        old_micros(old, &base);
        i128 m = base + unzigzag(z);
        if (m >= LLONG_MIN && m <= LLONG_MAX) return PyFloat_FromDouble((double)(long long)m / 1e6);
        PyObject *big = long_from_i128(m); /* (as Python: the int rounded to the nearest float) */
        double f = big ? PyLong_AsDouble(big) : -1.0;
        Py_XDECREF(big);
        return f == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(f / 1e6);
    }
    case 0xC0: {
        if (read_varint(r, &z)) return NULL;
        Py_ssize_t left = r->end - r->pos > 0 ? r->end - r->pos : 0;
        if (z > (u128)left) return damaged("a string longer than the %zd bytes left of its record", left), NULL;
        Py_ssize_t size = (Py_ssize_t)z;
        PyObject *s = PyUnicode_DecodeUTF8((const char *)r->p + r->pos, size, "strict");
        if (s == NULL || PyList_Append(self->strings, s)) {
            Py_XDECREF(s);
            return NULL;
        }
        skip(r, z);
        return s;
    }
    case 0xC1: {
        if (read_varint(r, &z)) return NULL;
        if (z >= (u128)PyList_GET_SIZE(self->strings)) {
            damaged("a string index beyond the table");
            return NULL;
        }
        PyObject *s = PyList_GET_ITEM(self->strings, (Py_ssize_t)z);
        Py_INCREF(s);
        return s;
    }
    case 0xC2:
    case 0xC3:
    case 0xC4:
    case 0xC5: {
        if (self->depth >= MAX_DEPTH) {
            damaged("values nested over %d deep", MAX_DEPTH);
            return NULL;
        }
        self->depth++;
        PyObject *v = tag == 0xC2   ? decode_list(self, r)
                      : tag == 0xC3 ? decode_dict(self, r)
                                    : decode_changes(self, r, old, tag == 0xC5);
        self->depth--;
        return v;
    }
    }
    if (tag >= 0x40 && tag < 0x80 && (tag >> 3 & 7) + (tag & 7) + 1 <= 8) { /* float: bits XOR the previous */
        int tz = tag >> 3 & 7, nb = (tag & 7) + 1;
        Py_ssize_t have = room(r, nb);
        uint64_t x = 0;
        for (Py_ssize_t k = 0; k < have; k++) x |= (uint64_t)r->p[r->pos + k] << (8 * k);
        x <<= 8 * tz;
        if (old != NULL && PyFloat_CheckExact(old)) x ^= float_bits(PyFloat_AS_DOUBLE(old));
        skip(r, nb);
        return PyFloat_FromDouble(bits_float(x));
    }
    if (tag >= 0x80 && tag < 0xC0) { /* a fingerprint */
        static const char digits[] = "0123456789abcdef";
        Py_ssize_t have = room(r, tag & 0x3F);
        PyObject *s = PyUnicode_New(2 * have, 127);
        if (s == NULL) return NULL;
        Py_UCS1 *c = PyUnicode_1BYTE_DATA(s);
        for (Py_ssize_t k = 0; k < have; k++) {
            c[2 * k] = digits[r->p[r->pos + k] >> 4];
            c[2 * k + 1] = digits[r->p[r->pos + k] & 15];
        }
        skip(r, tag & 0x3F);
        return s;
    }
    damaged("tag 0x%x", tag);
    return NULL;
}

/* one record (its body: pos..end of p) into (lines before it, event) */
static PyObject *decode_record(Records *self, const unsigned char *p, Py_ssize_t size) {
    Rd r = {p, 0, size};
    Bits m = {NULL, 0};
    self->depth = 0;
    if (read_bits(&r, 70, &m)) return NULL;
    Py_ssize_t n = self->n;
    if (beyond(&m, n)) return damaged("a field beyond the header's"), NULL;
    if (self->fresh) {
        if (!all(&m, n)) return damaged("a field missing from the first record"), NULL;
        self->fresh = 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* ints that change as they changed last time: no bit, no byte */
        if (self->delta[i] != NULL && !bit(&m, i)) {
            PyObject *v = PyNumber_Add(self->prev[i], self->delta[i]);
            if (v == NULL) return NULL;
            Py_SETREF(self->prev[i], v);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!bit(&m, i)) continue;
        PyObject *old = self->prev[i], *v;
        int tag;
        if (read_byte(&r, &tag)) return NULL;
        if (tag == 0x03 && old != NULL && PyLong_CheckExact(old)) { /* an int's change, less the predicted one */
            u128 z;
            if (read_varint(&r, &z)) return NULL;
            PyObject *surprise = long_from_i128(unzigzag(z));
            if (surprise == NULL) return NULL;
            PyObject *change = self->delta[i] ? PyNumber_Add(self->delta[i], surprise) : (Py_INCREF(surprise), surprise);
            Py_DECREF(surprise);
            if (change == NULL) return NULL;
            v = PyNumber_Add(old, change);
            int moves = PyObject_IsTrue(change);
            if (v == NULL || moves < 0) {
                Py_XDECREF(v);
                Py_DECREF(change);
                return NULL;
            }
            Py_XSETREF(self->delta[i], moves ? change : (Py_DECREF(change), NULL));
        } else {
            v = decode_value(self, &r, tag, old);
            if (v == NULL) return NULL;
            Py_CLEAR(self->delta[i]);
        }
        Py_XSETREF(self->prev[i], v);
    }
    if (r.pos != r.end) return damaged("a record of the wrong length"), NULL;
    PyObject *lines = self->prev[0];
    if (lines == NULL || !PyLong_CheckExact(lines)) return damaged("no line count"), NULL;
    PyObject *values = PyList_New(n - 1);
    if (values == NULL) return NULL;
    for (Py_ssize_t i = 1; i < n; i++) {
        Py_INCREF(self->prev[i]);
        PyList_SET_ITEM(values, i - 1, self->prev[i]);
    }
    Py_INCREF(lines);
    PyObject *event = PyObject_CallOneArg(self->build, values);
    Py_DECREF(values);
    PyObject *out = event ? PyTuple_Pack(2, lines, event) : NULL;
    Py_DECREF(lines);
    Py_XDECREF(event);
    return out;
}

static int records_fail(Records *self, PyObject *why) {
    self->damaged++;
    self->follows_known = 0;
    return PyList_GET_SIZE(self->problems) < 5 ? PyList_Append(self->problems, why) : 0;
}

/* the position of the next keyframe mark at or after pos, or -1: its 'T' found first (a run of zero
 * bytes, as a crash leaves on some file systems, is passed at memchr's speed) */
static Py_ssize_t find_keyframe(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t n) {
    while (pos + 4 <= n) {
        const unsigned char *t = memchr(buf + pos + 1, KEYFRAME[1], n - 3 - pos);
        if (t == NULL) return -1;
        pos = t - buf - 1;
        if (memcmp(buf + pos, KEYFRAME, 4) == 0) return pos;
        pos += 2; /* (no mark starts at the T) */
    }
    return -1;
}

/* a record's length at pos of the buffer: 0, -1 when it is cut at the end (wait for more), -2 for a
 * varint of over 11 bytes (damage) */
static int frame_length(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t n, u128 *size) {
    *size = 0;
    for (int shift = 0;; shift += 7) {
        if (shift > 70) return -2;
        if (*pos >= n) return -1;
        int b = buf[(*pos)++];
        *size |= (u128)(b & 0x7F) << shift;
        if (b < 0x80) return 0;
    }
}

/* damage: `what` at start (a keyframe, the seal) names another check than the records before it end with */
static int not_following(Records *self, const char *what, Py_ssize_t start, uint32_t follows, uint32_t before) {
    char why[200];
    snprintf(why, sizeof why,
             "byte %lld: %s does not follow the records before it (it follows check %08x, they end with %08x): "
             "records lost or repeated",
             self->at + (long long)start, what, (unsigned)follows, (unsigned)before);
    PyObject *text = PyUnicode_FromString(why);
    int rc = text == NULL || records_fail(self, text) ? -1 : 0;
    Py_XDECREF(text);
    return rc;
}

/* the records complete in buf[0:n] (the decoder's stepstream._Records.feed) */
static PyObject *records_decode(Records *self, const unsigned char *buf, Py_ssize_t n) {
    PyObject *out = PyList_New(0);
    Py_ssize_t pos = 0;
    while (out != NULL && pos < n) {
        if (self->seeking) {
            Py_ssize_t found = self->n ? find_keyframe(buf, pos, n) : -1;
            if (found < 0) {
                if (pos < n - 3) pos = n - 3;
                break;
            }
            pos = found;
            self->seeking = 0;
        }
        Py_ssize_t start = pos, tail = self->checked ? 1 : 0;
        int keyed = 0, before_known = self->follows_known;
        uint32_t follows = 0, before = self->follows;
        if (buf[pos] == 0) {
            if (n - pos < 4) break; /* the rest of the mark comes with the next piece */
            if (memcmp(buf + pos, KEYFRAME, 4) == 0) {
                pos += 4;
                if (tail) {
                    if (n - pos < 4) {
                        pos = start;
                        break;
                    }
                    follows = (uint32_t)buf[pos] | (uint32_t)buf[pos + 1] << 8 | (uint32_t)buf[pos + 2] << 16 |
                              (uint32_t)buf[pos + 3] << 24;
                    pos += 4;
                }
                records_reset(self);
                keyed = 1;
            }
        }
        u128 size;
        int framed = frame_length(buf, &pos, n, &size);
        if (framed == 0 && keyed && tail && size == 0) { /* a seal: the end of a log its writer closed */
            if (before_known && follows != before && not_following(self, "the end of the log", start, follows, before))
                Py_CLEAR(out);
            continue;
        }
        if (framed == -1 || (framed == 0 && size <= MAX_RECORD && (u128)(n - pos) < size + tail)) {
            pos = start; /* a record cut at the end of this piece: wait for the rest */
            break;
        }
        PyObject *record = NULL;
        Py_ssize_t end = pos + (Py_ssize_t)size;
        uint32_t want = 0;
        if (framed == -2 || size > MAX_RECORD) damaged("a record of over 16 MiB");
        else if (size == 0) damaged("a zero byte that is no keyframe mark");
        else if (!keyed && self->since_key >= KEYFRAME_EVERY)
            damaged("a record where a keyframe mark must be, %d records after the last", KEYFRAME_EVERY);
        else if (tail && (want = crc32_of(buf + start, end - start, self->chain), buf[end] != (want & 0xFF))) {
            char why[64];
            snprintf(why, sizeof why, "check %02x where its bytes give %02x", buf[end], (unsigned)(want & 0xFF));
            PyErr_SetString(PyExc_ValueError, why);
        } else {
            self->budget = BUDGET_PER_BYTE * (self->at + end + tail) + FREE_ITEMS;
            record = decode_record(self, buf + pos, (Py_ssize_t)size);
        }
        if (record != NULL) {
            if (PyList_Append(out, record)) Py_CLEAR(out);
            Py_DECREF(record);
            if (keyed && tail && before_known && follows != before &&
                not_following(self, "a keyframe", start, follows, before))
                Py_CLEAR(out);
            if (tail) {
                self->chain = self->follows = want;
                self->follows_known = 1;
            }
            self->since_key++;
            pos = end + tail;
            continue;
        }
        if (!(PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError) ||
              PyErr_ExceptionMatches(PyExc_IndexError))) {
            Py_CLEAR(out); /* (MemoryError and the like: no damage of the file) */
            break;
        }
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *why = PyUnicode_FromFormat("byte %lld: an undecodable step record (%S); read on from the next keyframe",
                                             self->at + (long long)start, value);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (why == NULL || records_fail(self, why)) Py_CLEAR(out);
        Py_XDECREF(why);
        pos = start + 1;
        self->seeking = 1;
    }
    PyObject *rest = out != NULL ? PyBytes_FromStringAndSize((const char *)buf + pos, n - pos) : NULL;
    if (rest == NULL) Py_CLEAR(out);
    else {
        Py_SETREF(self->buf, rest);
        self->at += pos;
    }
    return out;
}

static PyObject *records_feed(Records *self, PyObject *data) {
    if (self->buf == NULL) return PyErr_Format(PyExc_ValueError, "a Records not initialised");
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)) return NULL;
    PyObject *out, *joined = NULL;
    Py_ssize_t have = PyBytes_GET_SIZE(self->buf);
    if (have == 0) out = records_decode(self, view.buf, view.len);
    else if ((joined = PyBytes_FromStringAndSize(NULL, have + view.len)) == NULL) out = NULL;
    else {
        memcpy(PyBytes_AS_STRING(joined), PyBytes_AS_STRING(self->buf), have);
        memcpy(PyBytes_AS_STRING(joined) + have, view.buf, view.len);
        out = records_decode(self, (const unsigned char *)PyBytes_AS_STRING(joined), have + view.len);
    }
    Py_XDECREF(joined);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *records_finish(Records *self, PyObject *unused) {
    if (self->buf == NULL) return PyErr_Format(PyExc_ValueError, "a Records not initialised");
    PyObject *out = PyList_New(0);
    while (out != NULL && PyBytes_GET_SIZE(self->buf) && !self->seeking) {
        PyObject *why = PyUnicode_FromFormat("byte %lld: truncated last step record", self->at);
        if (why == NULL || records_fail(self, why)) {
            Py_XDECREF(why);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(why);
        self->truncated = 1;
        PyObject *rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(self->buf) + 1, PyBytes_GET_SIZE(self->buf) - 1);
        PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
        if (rest == NULL || empty == NULL) {
            Py_XDECREF(rest);
            Py_XDECREF(empty);
            Py_CLEAR(out);
            break;
        }
        Py_SETREF(self->buf, empty);
        self->seeking = 1;
        self->at++;
        PyObject *found = records_decode(self, (const unsigned char *)PyBytes_AS_STRING(rest), PyBytes_GET_SIZE(rest));
        Py_DECREF(rest);
        if (found == NULL || PyList_SetSlice(out, PyList_GET_SIZE(out), PyList_GET_SIZE(out), found)) Py_CLEAR(out);
        else if (PyList_GET_SIZE(found)) self->truncated = 0;
        Py_XDECREF(found);
    }
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    if (empty == NULL) Py_CLEAR(out);
    else {
        self->at += PyBytes_GET_SIZE(self->buf);
        Py_SETREF(self->buf, empty);
    }
    return out;
}

static PyObject *records_fail_method(Records *self, PyObject *why) {
    if (self->problems == NULL) return PyErr_Format(PyExc_ValueError, "a Records not initialised");
    if (!PyUnicode_Check(why)) return PyErr_Format(PyExc_TypeError, "a reason is a str");
    if (records_fail(self, why)) return NULL;
    Py_RETURN_NONE;
}

static int records_init(Records *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"nfields", "build", "checked", "offset", NULL};
    Py_ssize_t n;
    PyObject *build;
    int checked = 0;
    long long offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO|pL", names, &n, &build, &checked, &offset)) return -1;
    if (n < 0 || !PyCallable_Check(build) || self->strings != NULL) {
        PyErr_SetString(PyExc_ValueError, "Records(nfields >= 0, callable), made once");
        return -1;
    }
    self->prev = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    self->delta = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    self->strings = PyList_New(0);
    self->problems = PyList_New(0);
    self->buf = PyBytes_FromStringAndSize(NULL, 0);
    if (!self->prev || !self->delta || !self->strings || !self->problems || !self->buf) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(build);
    self->build = build;
    self->n = n;
    self->fresh = 1;
    self->checked = checked;
    self->at = offset;
    self->follows_known = 1; /* the first keyframe follows nothing: check 0 */
    self->seeking = n == 0; /* nothing in it can be read */
    return 0;
}

static int records_traverse(Records *self, visitproc visit, void *arg) {
    Py_VISIT(self->build);
    for (Py_ssize_t i = 0; self->prev != NULL && i < self->n; i++) Py_VISIT(self->prev[i]);
    return 0;
}

static int records_clear(Records *self) {
    Py_CLEAR(self->build);
    for (Py_ssize_t i = 0; self->prev != NULL && self->delta != NULL && i < self->n; i++) {
        Py_CLEAR(self->prev[i]);
        Py_CLEAR(self->delta[i]);
    }
    return 0;
}

static void records_dealloc(Records *self) {
    PyObject_GC_UnTrack(self);
    records_clear(self);
    PyMem_Free(self->prev);
    PyMem_Free(self->delta);
    Py_XDECREF(self->strings);
    Py_XDECREF(self->problems);
    Py_XDECREF(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef records_methods[] = {
    {"feed", (PyCFunction)records_feed, METH_O, "The records complete in what was fed so far: (lines before, event)."},
    {"finish", (PyCFunction)records_finish, METH_NOARGS, "At the end of the file: what a cut record left."},
    {"fail", (PyCFunction)records_fail_method, METH_O, "Count damage, with its reason."},
    {NULL},
};

static PyMemberDef records_members[] = {
    {"damaged", T_PYSSIZET, offsetof(Records, damaged), READONLY, "records (or stretches) that could not be read"},
    {"problems", T_OBJECT, offsetof(Records, problems), READONLY, "the first 5 reasons"},
    {"truncated", T_BOOL, offsetof(Records, truncated), 0, "the last record was cut and nothing after it read"},
    {NULL},
};

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "torchrepro.eventlog._stepcodec.Records",
    .tp_doc = "Records(nfields, build, checked=False, offset=0): the records of a stream after its header (stepstream._Records in C).",
    .tp_basicsize = sizeof(Records),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)records_init,
    .tp_dealloc = (destructor)records_dealloc,
    .tp_traverse = (traverseproc)records_traverse,
    .tp_clear = (inquiry)records_clear,
    .tp_methods = records_methods,
    .tp_members = records_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "torchrepro.eventlog._stepcodec",
    .m_doc = "The steps.bin codec in C (eventlog/stepstream.py is the specification and the fallback).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__stepcodec(void) {
    crc_init();
    if (PyType_Ready(&EncodingType) < 0 || PyType_Ready(&RecordsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "VERSION", VERSION) || PyModule_AddIntConstant(m, "KEYFRAME_EVERY", KEYFRAME_EVERY) ||
        PyModule_AddIntConstant(m, "MAX_RECORD", MAX_RECORD) || PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) ||
        PyModule_AddObject(m, "KEYFRAME", PyBytes_FromStringAndSize((const char *)KEYFRAME, 4)) ||
        PyModule_AddType(m, &EncodingType) || PyModule_AddType(m, &RecordsType)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
