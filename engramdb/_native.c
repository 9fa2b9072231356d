/* engramdb._native: the bulk-write path's batched crypto calls, in C over OpenSSL's libcrypto.
 *
 * Nothing here is a cipher or a hash of its own: every primitive is OpenSSL's EVP API
 * (AES-256-GCM, SHA-256), the same algorithms `cryptography` and `hashlib` call. The
 * module only removes the Python work around each call (one method call, one bytes
 * object, one slice per value) on batches of thousands of short values. Each function
 * gives byte for byte what its pure-Python counterpart in engramdb/crypto.py gives
 * (tests/test_native.py runs both on generated inputs); engramdb/_accel.py picks one.
 *
 *   seal_many(key, header, aad_prefix, nonces, items) -> list[bytes]
 *       for each (k, plaintext) of items, with nonce i = nonces[12*i:12*i+12]:
 *       header | nonce | AES-256-GCM(key, nonce, plaintext, aad = aad_prefix | u16be(len k) | k | header) | tag
 *   hmac_many(key, head, values, size) -> list[bytes]
 *       HMAC-SHA256(key, head | v)[:size] for each v
 *   state_sum(key, prefix, pairs) -> int
 *       sum of int.from_bytes(HMAC-SHA256(key, prefix | k | SHA-256(envelope)), "big")
 *       over (k, envelope) of pairs, modulo 2**256
 *   scan_words(data, offsets) -> (keys, inverse, firsts)
 *       the bulk tokenizer's word scan (engramdb/index/tokenize.py, _token_values): the
 *       words of `data` (already translated: a space ends a word) of two bytes or more,
 *       grouped by a hash table; keys are the distinct words in first-seen order (the int
 *       of up to 16 bytes read little-endian, or the bytes of a longer word), inverse the
 *       int64 key index of every word in order, firsts (int64) per offset the number of
 *       words starting before it
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <openssl/evp.h>
#include <openssl/opensslv.h>

#define NONCE_BYTES 12
#define TAG_BYTES 16
#define SHA_BYTES 32
#define BLOCK_BYTES 64

static const EVP_MD *sha256_md = NULL;
static const EVP_CIPHER *gcm_cipher = NULL;

static PyObject *
openssl_error(const char *what)
{
    PyErr_Format(PyExc_RuntimeError, "OpenSSL %s failed", what);
    return NULL;
}

/* A borrowed (pointer, length) of a bytes object; TypeError for anything else. */
static int
bytes_view(PyObject *obj, const unsigned char **data, Py_ssize_t *size, const char *what)
{
    if (!PyBytes_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    *data = (const unsigned char *)PyBytes_AS_STRING(obj);
    *size = PyBytes_GET_SIZE(obj);
    return 0;
}

/* The two halves of a 2-tuple of bytes. */
static int
pair_view(PyObject *item, const unsigned char **a, Py_ssize_t *alen, const unsigned char **b, Py_ssize_t *blen)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
        PyErr_SetString(PyExc_TypeError, "items must be (bytes, bytes) tuples");
        return -1;
    }
    if (bytes_view(PyTuple_GET_ITEM(item, 0), a, alen, "a key") < 0)
        return -1;
    return bytes_view(PyTuple_GET_ITEM(item, 1), b, blen, "a value");
}

/* HMAC-SHA256 with the key's inner and outer states hashed once (RFC 2104). */
typedef struct {
    EVP_MD_CTX *inner, *outer, *work;
} hmac_state;

static void
hmac_free(hmac_state *h)
{
    EVP_MD_CTX_free(h->inner);
    EVP_MD_CTX_free(h->outer);
    EVP_MD_CTX_free(h->work);
}

static int
hmac_init(hmac_state *h, const unsigned char *key, Py_ssize_t keylen)
{
    unsigned char block[BLOCK_BYTES], pad[BLOCK_BYTES];
    unsigned int n = 0;
    int i, ok;
    memset(block, 0, sizeof block);
    h->inner = EVP_MD_CTX_new();
    h->outer = EVP_MD_CTX_new();
    h->work = EVP_MD_CTX_new();
    if (!h->inner || !h->outer || !h->work)
        return 0;
    if (keylen > BLOCK_BYTES) {
        if (!EVP_Digest(key, (size_t)keylen, block, &n, sha256_md, NULL))
            return 0;
    } else {
        memcpy(block, key, (size_t)keylen);
    }
    for (i = 0; i < BLOCK_BYTES; i++)
        pad[i] = block[i] ^ 0x36;
    ok = EVP_DigestInit_ex(h->inner, sha256_md, NULL) && EVP_DigestUpdate(h->inner, pad, BLOCK_BYTES);
    for (i = 0; i < BLOCK_BYTES; i++)
        pad[i] = block[i] ^ 0x5C;
    ok = ok && EVP_DigestInit_ex(h->outer, sha256_md, NULL) && EVP_DigestUpdate(h->outer, pad, BLOCK_BYTES);
    return ok;
}

/* HMAC of the concatenation a | b | c (any may be empty) into out[32]. */
static int
hmac3(hmac_state *h, const unsigned char *a, size_t alen, const unsigned char *b, size_t blen,
      const unsigned char *c, size_t clen, unsigned char *out)
{
    unsigned char inner[SHA_BYTES];
    unsigned int n = 0;
    return EVP_MD_CTX_copy_ex(h->work, h->inner)
        && EVP_DigestUpdate(h->work, a, alen) && EVP_DigestUpdate(h->work, b, blen)
        && EVP_DigestUpdate(h->work, c, clen) && EVP_DigestFinal_ex(h->work, inner, &n)
        && EVP_MD_CTX_copy_ex(h->work, h->outer)
        && EVP_DigestUpdate(h->work, inner, SHA_BYTES) && EVP_DigestFinal_ex(h->work, out, &n);
}

static PyObject *
hmac_many(PyObject *self, PyObject *args)
{
    PyObject *keyobj, *headobj, *values, *seq, *out = NULL;
    Py_ssize_t size, keylen, headlen, n, i;
    const unsigned char *key, *head;
    hmac_state h = {NULL, NULL, NULL};
    unsigned char mac[SHA_BYTES];
    (void)self;
    if (!PyArg_ParseTuple(args, "SSOn", &keyobj, &headobj, &values, &size))
        return NULL;
    if (size < 0 || size > SHA_BYTES) {
        PyErr_SetString(PyExc_ValueError, "size must be 0..32");
        return NULL;
    }
    key = (const unsigned char *)PyBytes_AS_STRING(keyobj);
    keylen = PyBytes_GET_SIZE(keyobj);
    head = (const unsigned char *)PyBytes_AS_STRING(headobj);
    headlen = PyBytes_GET_SIZE(headobj);
    seq = PySequence_Fast(values, "values must be a sequence of bytes");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (!hmac_init(&h, key, keylen)) {
        openssl_error("HMAC set-up");
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        const unsigned char *v;
        Py_ssize_t vlen;
        PyObject *b;
        if (bytes_view(PySequence_Fast_GET_ITEM(seq, i), &v, &vlen, "a value") < 0)
            goto fail;
        if (!hmac3(&h, head, (size_t)headlen, v, (size_t)vlen, NULL, 0, mac)) {
            openssl_error("HMAC");
            goto fail;
        }
        b = PyBytes_FromStringAndSize((const char *)mac, size);
        if (b == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, b);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    hmac_free(&h);
    Py_DECREF(seq);
    return out;
}

static PyObject *
state_sum(PyObject *self, PyObject *args)
{
    PyObject *keyobj, *prefixobj, *pairs, *seq, *result = NULL;
    Py_ssize_t n, i;
    hmac_state h = {NULL, NULL, NULL};
    EVP_MD_CTX *sha = NULL;
    /* the sum modulo 2**256, as four 64-bit limbs, least significant first */
    unsigned long long acc[4] = {0, 0, 0, 0};
    unsigned char mac[SHA_BYTES], digest[SHA_BYTES], be[SHA_BYTES];
    unsigned int dn = 0;
    int limb, j;
    (void)self;
    if (!PyArg_ParseTuple(args, "SSO", &keyobj, &prefixobj, &pairs))
        return NULL;
    seq = PySequence_Fast(pairs, "pairs must be a sequence of (bytes, bytes)");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    sha = EVP_MD_CTX_new();
    if (sha == NULL || !hmac_init(&h, (const unsigned char *)PyBytes_AS_STRING(keyobj), PyBytes_GET_SIZE(keyobj))) {
        openssl_error("HMAC set-up");
        goto done;
    }
    for (i = 0; i < n; i++) {
        const unsigned char *k, *env;
        Py_ssize_t klen, envlen;
        unsigned long long carry = 0;
        if (pair_view(PySequence_Fast_GET_ITEM(seq, i), &k, &klen, &env, &envlen) < 0)
            goto done;
        if (!EVP_DigestInit_ex(sha, sha256_md, NULL) || !EVP_DigestUpdate(sha, env, (size_t)envlen)
            || !EVP_DigestFinal_ex(sha, digest, &dn)
            || !hmac3(&h, (const unsigned char *)PyBytes_AS_STRING(prefixobj), (size_t)PyBytes_GET_SIZE(prefixobj),
                      k, (size_t)klen, digest, SHA_BYTES, mac)) {
            openssl_error("SHA-256");
            goto done;
        }
        for (limb = 0; limb < 4; limb++) {  /* limb 0 holds the mac's last 8 (least significant) bytes */
            unsigned long long word = 0, sum, total;
            for (j = 0; j < 8; j++)
                word = (word << 8) | mac[SHA_BYTES - 8 * (limb + 1) + j];
            sum = acc[limb] + word;
            total = sum + carry;
            carry = (unsigned long long)((sum < word) | (total < sum));
            acc[limb] = total;
        }
    }
    for (limb = 0; limb < 4; limb++)
        for (j = 0; j < 8; j++)
            be[SHA_BYTES - 8 * limb - 1 - j] = (unsigned char)(acc[limb] >> (8 * j));
    result = PyBytes_FromStringAndSize((const char *)be, SHA_BYTES);
done:
    hmac_free(&h);
    EVP_MD_CTX_free(sha);
    Py_DECREF(seq);
    return result;
}

static PyObject *
seal_many(PyObject *self, PyObject *args)
{
    PyObject *keyobj, *headerobj, *prefixobj, *noncesobj, *items, *seq, *out = NULL;
    Py_ssize_t n, i, hlen, plen, maxkey = 0;
    const unsigned char *header, *prefix, *nonces;
    unsigned char *aad = NULL;
    EVP_CIPHER_CTX *ctx = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "SSSSO", &keyobj, &headerobj, &prefixobj, &noncesobj, &items))
        return NULL;
    if (PyBytes_GET_SIZE(keyobj) != 32) {
        PyErr_SetString(PyExc_ValueError, "an AES-256 key is 32 bytes");
        return NULL;
    }
    header = (const unsigned char *)PyBytes_AS_STRING(headerobj);
    hlen = PyBytes_GET_SIZE(headerobj);
    prefix = (const unsigned char *)PyBytes_AS_STRING(prefixobj);
    plen = PyBytes_GET_SIZE(prefixobj);
    nonces = (const unsigned char *)PyBytes_AS_STRING(noncesobj);
    seq = PySequence_Fast(items, "items must be a sequence of (bytes, bytes)");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (PyBytes_GET_SIZE(noncesobj) != n * NONCE_BYTES) {
        PyErr_SetString(PyExc_ValueError, "one 12-byte nonce per item");
        goto done;
    }
    for (i = 0; i < n; i++) {
        const unsigned char *k, *pt;
        Py_ssize_t klen, ptlen;
        if (pair_view(PySequence_Fast_GET_ITEM(seq, i), &k, &klen, &pt, &ptlen) < 0)
            goto done;
        if (klen > 0xFFFF || ptlen > INT_MAX - 64) {
            PyErr_SetString(PyExc_ValueError, "a key or value is too long");
            goto done;
        }
        if (klen > maxkey)
            maxkey = klen;
    }
    aad = PyMem_Malloc((size_t)(plen + 2 + maxkey + hlen));
    ctx = EVP_CIPHER_CTX_new();
    if (aad == NULL || ctx == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (!EVP_EncryptInit_ex(ctx, gcm_cipher, NULL, (const unsigned char *)PyBytes_AS_STRING(keyobj), NULL)) {
        openssl_error("AES-GCM set-up");
        goto done;
    }
    memcpy(aad, prefix, (size_t)plen);
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        const unsigned char *k, *pt, *nonce = nonces + i * NONCE_BYTES;
        Py_ssize_t klen, ptlen, aadlen;
        unsigned char *env;
        int outl = 0, finl = 0;
        PyObject *b;
        pair_view(PySequence_Fast_GET_ITEM(seq, i), &k, &klen, &pt, &ptlen);  /* checked above */
        aad[plen] = (unsigned char)(klen >> 8);
        aad[plen + 1] = (unsigned char)(klen & 0xFF);
        memcpy(aad + plen + 2, k, (size_t)klen);
        memcpy(aad + plen + 2 + klen, header, (size_t)hlen);
        aadlen = plen + 2 + klen + hlen;
        b = PyBytes_FromStringAndSize(NULL, hlen + NONCE_BYTES + ptlen + TAG_BYTES);
        if (b == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, b);
        env = (unsigned char *)PyBytes_AS_STRING(b);
        memcpy(env, header, (size_t)hlen);
        memcpy(env + hlen, nonce, NONCE_BYTES);
        if (!EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce)
            || !EVP_EncryptUpdate(ctx, NULL, &outl, aad, (int)aadlen)
            || (ptlen && !EVP_EncryptUpdate(ctx, env + hlen + NONCE_BYTES, &outl, pt, (int)ptlen))
            || !EVP_EncryptFinal_ex(ctx, env + hlen + NONCE_BYTES + (ptlen ? outl : 0), &finl)
            || !EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_BYTES, env + hlen + NONCE_BYTES + ptlen)) {
            openssl_error("AES-GCM");
            goto fail;
        }
        if ((ptlen ? outl : 0) + finl != ptlen) {
            openssl_error("AES-GCM length");
            goto fail;
        }
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    EVP_CIPHER_CTX_free(ctx);
    PyMem_Free(aad);
    Py_DECREF(seq);
    return out;
}

/* ---- the bulk tokenizer's word scan ------------------------------------------------ */

typedef struct {
    Py_ssize_t start;  /* -1: an empty slot */
    Py_ssize_t len;
    Py_ssize_t index;
    unsigned long long low, high;  /* a word of up to 16 bytes: its bytes, little-endian (0 beyond) */
} word_slot;

/* Up to 8 bytes at w as a little-endian integer (bytes beyond `len` are not read). */
static unsigned long long
load_le(const unsigned char *w, Py_ssize_t len, int whole)
{
    unsigned long long v = 0;
    Py_ssize_t i;
    if (whole) {  /* 8 readable bytes: one load, masked */
        unsigned char b[8];
        memcpy(b, w, 8);
        for (i = 7; i >= 0; i--)
            v = (v << 8) | b[i];  /* compilers turn this into one load on little-endian machines */
        return len >= 8 ? v : v & ((1ULL << (8 * len)) - 1);
    }
    for (i = (len < 8 ? len : 8) - 1; i >= 0; i--)
        v = (v << 8) | w[i];
    return v;
}

static unsigned long long
mix(unsigned long long h)
{
    h ^= h >> 33;  /* murmur3's finaliser: the table indexes by the low bits */
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

/* The Python key of a word: the int low | high << 64 of up to 16 bytes, else its bytes. */
static PyObject *
word_key(const unsigned char *w, Py_ssize_t len, unsigned long long low, unsigned long long high)
{
    PyObject *hi, *shift, *shifted, *lo, *key;
    if (len > 16)
        return PyBytes_FromStringAndSize((const char *)w, len);
    if (high == 0)
        return PyLong_FromUnsignedLongLong(low);
    hi = PyLong_FromUnsignedLongLong(high);
    shift = PyLong_FromLong(64);
    shifted = (hi && shift) ? PyNumber_Lshift(hi, shift) : NULL;
    lo = PyLong_FromUnsignedLongLong(low);
    key = (shifted && lo) ? PyNumber_Or(shifted, lo) : NULL;
    Py_XDECREF(hi);
    Py_XDECREF(shift);
    Py_XDECREF(shifted);
    Py_XDECREF(lo);
    return key;
}

static int
grow_table(word_slot **table, Py_ssize_t *cap)
{
    Py_ssize_t newcap = *cap * 2, i, j;
    word_slot *bigger = PyMem_Malloc((size_t)newcap * sizeof(word_slot)), *old = *table;
    if (bigger == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < newcap; i++)
        bigger[i].start = -1;
    for (i = 0; i < *cap; i++) {
        if (old[i].start < 0)
            continue;
        j = (Py_ssize_t)(mix(old[i].low ^ (old[i].high * 0x9E3779B97F4A7C15ULL) ^ (unsigned long long)old[i].len)
                         & (unsigned long long)(newcap - 1));
        while (bigger[j].start >= 0)
            j = (j + 1) & (newcap - 1);
        bigger[j] = old[i];
    }
    PyMem_Free(old);
    *table = bigger;
    *cap = newcap;
    return 0;
}

static PyObject *
scan_words(PyObject *self, PyObject *args)
{
    Py_buffer data, offs;
    const unsigned char *d;
    const long long *offsets;
    Py_ssize_t n, noffs, pos = 0, nwords = 0, o = 0, cap = 4096, i, used = 0;
    word_slot *table = NULL;
    long long *inverse = NULL, *firsts = NULL;
    PyObject *keys = NULL, *inv_obj = NULL, *firsts_obj = NULL, *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &offs))
        return NULL;
    d = (const unsigned char *)data.buf;
    n = data.len;
    offsets = (const long long *)offs.buf;
    noffs = offs.len / (Py_ssize_t)sizeof(long long);
    table = PyMem_Malloc((size_t)cap * sizeof(word_slot));
    /* a word of two bytes or more and the space after it take three bytes */
    inverse = PyMem_Malloc((size_t)(n / 3 + 2) * sizeof(long long));
    firsts = PyMem_Malloc((size_t)(noffs + 1) * sizeof(long long));
    keys = PyList_New(0);
    if (!table || !inverse || !firsts || !keys) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < cap; i++)
        table[i].start = -1;
    while (pos < n) {
        Py_ssize_t start, len, slot, mask = cap - 1;
        unsigned long long low, high = 0, h;
        while (pos < n && d[pos] == 0x20)
            pos++;
        if (pos >= n)
            break;
        start = pos;
        while (pos < n && d[pos] != 0x20)
            pos++;
        len = pos - start;
        while (o < noffs && offsets[o] <= start)  /* the texts that start at or before this word */
            firsts[o++] = nwords;
        if (len < 2)
            continue;
        if (len <= 16) {
            low = load_le(d + start, len, start + 8 <= n);
            if (len > 8)
                high = load_le(d + start + 8, len - 8, start + 16 <= n);
        } else {  /* longer words (rare): hashed by their bytes, numbered by their bytes */
            low = 0xcbf29ce484222325ULL;
            for (i = 0; i < len; i++)
                low = (low ^ d[start + i]) * 0x100000001b3ULL;
            high = 0;
        }
        h = mix(low ^ (high * 0x9E3779B97F4A7C15ULL) ^ (unsigned long long)len);
        slot = (Py_ssize_t)(h & (unsigned long long)mask);
        while (table[slot].start >= 0
               && !(table[slot].low == low && table[slot].high == high && table[slot].len == len
                    && (len <= 16 || memcmp(d + table[slot].start, d + start, (size_t)len) == 0)))
            slot = (slot + 1) & mask;
        if (table[slot].start < 0) {
            PyObject *key = word_key(d + start, len, low, high);
            if (key == NULL || PyList_Append(keys, key) < 0) {
                Py_XDECREF(key);
                goto done;
            }
            Py_DECREF(key);
            table[slot].start = start;
            table[slot].len = len;
            table[slot].low = low;
            table[slot].high = high;
            table[slot].index = used++;
            inverse[nwords++] = used - 1;
            if (2 * used > cap && grow_table(&table, &cap) < 0)  /* keep the table at most half full */
                goto done;
            continue;
        }
        inverse[nwords++] = table[slot].index;
    }
    while (o < noffs)
        firsts[o++] = nwords;
    inv_obj = PyBytes_FromStringAndSize((const char *)inverse, nwords * (Py_ssize_t)sizeof(long long));
    firsts_obj = PyBytes_FromStringAndSize((const char *)firsts, noffs * (Py_ssize_t)sizeof(long long));
    if (inv_obj && firsts_obj)
        result = PyTuple_Pack(3, keys, inv_obj, firsts_obj);
done:
    Py_XDECREF(keys);
    Py_XDECREF(inv_obj);
    Py_XDECREF(firsts_obj);
    PyMem_Free(table);
    PyMem_Free(inverse);
    PyMem_Free(firsts);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offs);
    return result;
}

static PyMethodDef methods[] = {
    {"seal_many", seal_many, METH_VARARGS, "AES-256-GCM envelopes of (key, plaintext) items (see the module comment)."},
    {"hmac_many", hmac_many, METH_VARARGS, "HMAC-SHA256(key, head | v)[:size] of each value v."},
    {"state_sum", state_sum, METH_VARARGS, "The sum of the state-digest terms of (key, envelope) pairs, mod 2**256, "
                                           "as 32 big-endian bytes."},
    {"scan_words", scan_words, METH_VARARGS, "The bulk tokenizer's word scan: (keys, inverse, firsts)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "engramdb._native",
    "The bulk-write path's batched crypto calls over OpenSSL (see engramdb/_accel.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    gcm_cipher = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
#else
    sha256_md = EVP_sha256();
    gcm_cipher = EVP_aes_256_gcm();
#endif
    if (sha256_md == NULL || gcm_cipher == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256 or AES-256-GCM");
        return NULL;
    }
    return PyModule_Create(&module);
}
