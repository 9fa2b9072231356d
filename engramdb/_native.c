/* engramdb._native: the bulk-write path's per-record work, in C: batched crypto calls over
 * OpenSSL's libcrypto, the bulk tokenizer's word scan, node objects and records, and a
 * segment's postings and posting blocks.
 *
 * Nothing here is a cipher or a hash of its own: every primitive is OpenSSL's EVP API
 * (AES-256-GCM, SHA-256), the same algorithms `cryptography` and `hashlib` call. The
 * module only removes the Python work around each call (one method call, one bytes
 * object, one slice per value) on batches of thousands of short values. Each function
 * gives byte for byte what its pure-Python counterpart (engramdb/crypto.py, codec.py,
 * records.py, index/tokenize.py, index/bm25.py) gives (tests/test_native.py runs both on
 * generated inputs); engramdb/_accel.py picks one.
 *
 *   seal_many(key, header, aad_prefix, nonces, items) -> list[bytes]
 *       for each (k, plaintext) of items, with nonce i = nonces[12*i:12*i+12]:
 *       header | nonce | AES-256-GCM(key, nonce, plaintext, aad = aad_prefix | u16be(len k) | k | header) | tag
 *   hmac_many(key, head, values, size) -> list[bytes]
 *       HMAC-SHA256(key, head | v)[:size] for each v
 *   state_sum(key, prefix, pairs) -> int
 *       sum of int.from_bytes(HMAC-SHA256(key, prefix | k | SHA-256(envelope)), "big")
 *       over (k, envelope) of pairs, modulo 2**256
 *   scan_texts(texts, table) -> (words, inverse, firsts)
 *       the bulk tokenizer's word scan (engramdb/index/tokenize.py, Tokenizer.encode_many):
 *       each text (an ASCII str, or the UTF-8 bytes of another) mapped byte by byte through
 *       the 256-byte `table` (a space ends a word), its words of two bytes or more grouped
 *       by a hash table; words are the distinct words (str, decoded from UTF-8 with
 *       surrogatepass) in first-seen order, inverse the int64 word number of every word in
 *       order, firsts (int64) per text the number of words before it
 *   keep_tokens(inverse, firsts, values) -> (ids, lengths)
 *       ids (int64) = values[w] for each word number w of inverse whose value is >= 0, in
 *       order; lengths (int64) per text the number of those among its words (firsts as
 *       scan_texts gives them)
 *   plain_records(dicts, names, defaults, threshold) -> list[bytes | None]
 *       engramdb/codec.py's encode_nodes for each node instance dict in the common shape:
 *       every field in `names` holding the object of `defaults` at its place, a non-empty
 *       str content, float created_at and last_accessed equal (same sign of a zero), an
 *       empty metadata dict, and embeddings a dict of str keys (at most 15): the record
 *       0x01 | msgpack [3, mask, id, created_at, content(, sorted spaces)] when its body
 *       is at most `threshold` bytes; None for any other node (the pure path encodes it)
 *   posting_blocks(docnos, values, bounds, zstd_min) -> (blocks, compress) or None
 *       engramdb/index/bm25.py's encode_blocks over uint64 columns and int64 bounds: block j
 *       (rows bounds[j]:bounds[j+1]) is its 7-byte head (kind, u32 count, widths) and its
 *       delta-coded body; `compress` lists the blocks whose body is at least zstd_min bytes,
 *       which carry the zstd kind and the raw body for the caller to compress. None when
 *       the docnos of a block are not strictly increasing (the caller's pure path raises).
 *   count_postings(term_ids, lengths, order, docnos, nterms) -> (docnos, tfs, bounds)
 *       engramdb/index/bm25.py's count_postings by counting instead of sorting: documents
 *       (their tokens' int64 term ids one document after another, `lengths` tokens each)
 *       visited in `order` (int64: by docno), each term's postings are the uint64 docnos
 *       of the documents holding it in that order and their int64 term frequencies, term
 *       j owning rows bounds[j]:bounds[j+1] (int64, nterms + 1 of them)
 *   columns_pass(rows, specs) -> bool
 *       engramdb/records.py's _columns_pass in one pass over the rows (see the function)
 *   new_nodes(cls, defaults, rows, vectors) -> list
 *       engramdb/records.py's Node.from_fields_many once its columns are checked: per row,
 *       cls.__new__(cls) whose __dict__ is a copy of `defaults` with fresh metadata and
 *       embeddings dicts, updated with the row, and then vectors[i] as its embeddings when
 *       vectors is not None
 *   accumulate(acc, docnos, values, codes) -> None
 *       engramdb/index/bm25.py's SegmentedBM25.top() add of one posting run:
 *       acc[docnos[i]] += values[codes[i]] (values[i] when codes is None) for each i, over
 *       float64 acc/values and integer docnos/codes of any width; the same float64
 *       additions as numpy's fancy-indexed add when the docnos are distinct
 *   frontier_best(values, front, sizes, starts, docnos, rest, k, out_docnos, out_values) -> int
 *       engramdb/index/bm25.py's _Run._frontier_best: a run's k best from its frontier, or -1
 *       when the frontier cannot tell them (see the function, at the end of the file)
 *   best_runs(runs, k, out_docnos, out_values) -> int
 *       engramdb/index/bm25.py's _Term.best: the k best (docno, value) of (docnos, codes,
 *       values) posting runs, value descending then docno ascending (see the function, at
 *       the end of the file)
 *   concat_postings(parts, out_docnos, out_tf, out_dl) -> bool
 *       engramdb/index/bm25.py's _delta: (docnos, tf, dl) blocks' columns one after another,
 *       and whether the docnos increase across the blocks (see the function, at the end)
 *   term_holders(blind, small, old_live, old_holders, dead_sizes) -> (holders, counts)
 *       engramdb/index/bm25.py's SegmentedBM25._holders and _counts: the small segments of
 *       a read state holding a term, from its cached entry's, and their tombstone counts
 *       (see the function, at the end)
 *   idf_values(call_info, n_docs, dfs) -> list[float]
 *       engramdb/index/bm25.py's _idfs: Lucene's idf of each df, the log1p by numpy's own
 *       float64 loop (call_info: numpy.log1p's, see the function, at the end)
 *   term_values(call_info, n_docs, avgdl, k1, b, specs, empty) -> list[(base, delta)]
 *       engramdb/index/bm25.py's _Term.of: idf_values and pair_values for a query's terms
 *       in one call, into one new array (see the function, at the end)
 *   fresh_delta(blind, docnos, tf, dl, fresh, empty, int64) -> (docnos, tf, dl, sizes, increasing)
 *       engramdb/index/bm25.py's SegmentedBM25._delta when only segments this handle wrote
 *       come: the old delta's columns and the term's postings in each (see the function)
 *   top_terms(acc, terms, longest, best, k, empty, uint64) -> (docnos, scores)
 *       engramdb/index/bm25.py's SegmentedBM25.top for two or more terms: the adds into the
 *       accumulator and the k best distinct candidates, as new arrays (see the function)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <math.h>
#include <fenv.h>
#define OPENSSL_SUPPRESS_DEPRECATED  /* SHA256_Init and friends: see sha_ctx below */
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/crypto.h>
#include <openssl/opensslv.h>

#define NONCE_BYTES 12
#define TAG_BYTES 16
#define SHA_BYTES 32
#define BLOCK_BYTES 64

static const EVP_MD *sha256_md = NULL;
/* interned field names of a node's instance dict (plain_records) */
static PyObject *key_id, *key_content, *key_created_at, *key_last_accessed, *key_metadata, *key_embeddings;
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

/* SHA-256 contexts. Where OpenSSL still declares its low-level SHA256_* functions (1.1 and
 * 3.x; deprecated in 3.0 but built by default), a context is a plain struct that HMAC's
 * precomputed inner and outer states are copied from by assignment: EVP_MD_CTX_copy_ex
 * allocates a provider context per copy, which cost about half of each short HMAC. The
 * compression function is OpenSSL's either way (SHA-NI where the CPU has it). Elsewhere,
 * or built with -DENGRAMDB_EVP_SHA, the same steps go through EVP. */
#if defined(ENGRAMDB_EVP_SHA) || defined(OPENSSL_NO_DEPRECATED_3_0) || \
    (defined(OPENSSL_VERSION_MAJOR) && OPENSSL_VERSION_MAJOR >= 4)
#define SHA_EVP 1
typedef EVP_MD_CTX *sha_ctx;
static int sha_new(sha_ctx *c) { return (*c = EVP_MD_CTX_new()) != NULL; }
static void sha_free(sha_ctx *c) { EVP_MD_CTX_free(*c); *c = NULL; }
static int sha_init(sha_ctx *c) { return EVP_DigestInit_ex(*c, sha256_md, NULL); }
static int sha_update(sha_ctx *c, const void *p, size_t n) { return EVP_DigestUpdate(*c, p, n); }
static int sha_final(sha_ctx *c, unsigned char *out) { unsigned int n = 0; return EVP_DigestFinal_ex(*c, out, &n); }
static int sha_copy(sha_ctx *to, sha_ctx *from) { return EVP_MD_CTX_copy_ex(*to, *from); }
#else
#define SHA_EVP 0
typedef SHA256_CTX sha_ctx;
static int sha_new(sha_ctx *c) { (void)c; return 1; }
static void sha_free(sha_ctx *c) { OPENSSL_cleanse(c, sizeof *c); }
static int sha_init(sha_ctx *c) { return SHA256_Init(c); }
static int sha_update(sha_ctx *c, const void *p, size_t n) { return SHA256_Update(c, p, n); }
static int sha_final(sha_ctx *c, unsigned char *out) { return SHA256_Final(out, c); }
static int sha_copy(sha_ctx *to, sha_ctx *from) { *to = *from; return 1; }
#endif

/* HMAC-SHA256 with the key's inner and outer states hashed once (RFC 2104). */
typedef struct {
    sha_ctx inner, outer, work;
} hmac_state;

static void
hmac_free(hmac_state *h)
{
    sha_free(&h->inner);
    sha_free(&h->outer);
    sha_free(&h->work);
}

static int
hmac_init(hmac_state *h, const unsigned char *key, Py_ssize_t keylen)
{
    unsigned char block[BLOCK_BYTES], pad[BLOCK_BYTES];
    int i, ok;
    memset(block, 0, sizeof block);
    if (!sha_new(&h->inner) || !sha_new(&h->outer) || !sha_new(&h->work))
        return 0;
    if (keylen > BLOCK_BYTES) {
        if (!sha_init(&h->work) || !sha_update(&h->work, key, (size_t)keylen) || !sha_final(&h->work, block))
            return 0;
    } else {
        memcpy(block, key, (size_t)keylen);
    }
    for (i = 0; i < BLOCK_BYTES; i++)
        pad[i] = block[i] ^ 0x36;
    ok = sha_init(&h->inner) && sha_update(&h->inner, pad, BLOCK_BYTES);
    for (i = 0; i < BLOCK_BYTES; i++)
        pad[i] = block[i] ^ 0x5C;
    ok = ok && sha_init(&h->outer) && sha_update(&h->outer, pad, BLOCK_BYTES);
    OPENSSL_cleanse(block, sizeof block);
    OPENSSL_cleanse(pad, sizeof pad);
    return ok;
}

/* HMAC of the concatenation a | b | c (any may be empty) into out[32]. */
static int
hmac3(hmac_state *h, const unsigned char *a, size_t alen, const unsigned char *b, size_t blen,
      const unsigned char *c, size_t clen, unsigned char *out)
{
    unsigned char inner[SHA_BYTES];
    return sha_copy(&h->work, &h->inner)
        && sha_update(&h->work, a, alen) && sha_update(&h->work, b, blen)
        && sha_update(&h->work, c, clen) && sha_final(&h->work, inner)
        && sha_copy(&h->work, &h->outer)
        && sha_update(&h->work, inner, SHA_BYTES) && sha_final(&h->work, out);
}

static PyObject *
hmac_many(PyObject *self, PyObject *args)
{
    PyObject *keyobj, *headobj, *values, *seq, *out = NULL;
    Py_ssize_t size, keylen, headlen, n, i;
    const unsigned char *key, *head;
    hmac_state h;
    unsigned char mac[SHA_BYTES];
    (void)self;
    memset(&h, 0, sizeof h);  /* NULL contexts: hmac_free may run before hmac_init */
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
    hmac_state h;
    sha_ctx sha;
    /* the sum modulo 2**256, as four 64-bit limbs, least significant first */
    unsigned long long acc[4] = {0, 0, 0, 0};
    unsigned char mac[SHA_BYTES], digest[SHA_BYTES], be[SHA_BYTES];
    int limb, j;
    (void)self;
    memset(&h, 0, sizeof h);
    memset(&sha, 0, sizeof sha);
    if (!PyArg_ParseTuple(args, "SSO", &keyobj, &prefixobj, &pairs))
        return NULL;
    seq = PySequence_Fast(pairs, "pairs must be a sequence of (bytes, bytes)");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (!sha_new(&sha) || !hmac_init(&h, (const unsigned char *)PyBytes_AS_STRING(keyobj), PyBytes_GET_SIZE(keyobj))) {
        openssl_error("HMAC set-up");
        goto done;
    }
    for (i = 0; i < n; i++) {
        const unsigned char *k, *env;
        Py_ssize_t klen, envlen;
        unsigned long long carry = 0;
        if (pair_view(PySequence_Fast_GET_ITEM(seq, i), &k, &klen, &env, &envlen) < 0)
            goto done;
        if (!sha_init(&sha) || !sha_update(&sha, env, (size_t)envlen) || !sha_final(&sha, digest)
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
    sha_free(&sha);
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

typedef struct {  /* 16 bytes: the table of a chunk's ~10^4 words stays in the CPU's caches */
    unsigned long long first8;  /* the word's first (up to) 8 bytes, big-endian */
    unsigned int len;
    int index;  /* the word's number (first-seen order); -1: an empty slot */
} word_slot;

static unsigned long long
mix(unsigned long long h)
{
    h ^= h >> 33;  /* murmur3's finaliser: the table indexes by the low bits */
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

/* A hash of a word's bytes, eight at a time; *first8 gets its first (up to) 8 bytes. */
static unsigned long long
word_hash(const unsigned char *w, Py_ssize_t len, unsigned long long *first8)
{
    unsigned long long h = 0x9E3779B97F4A7C15ULL, v = 0;
    Py_ssize_t i;
    int k = 0;
    *first8 = 0;
    for (i = 0; i < len; i++) {
        v = (v << 8) | w[i];
        if (++k == 8) {
            if (i == 7)
                *first8 = v;
            h = (h ^ v) * 0xC2B2AE3D27D4EB4FULL;
            h ^= h >> 29;
            v = 0;
            k = 0;
        }
    }
    if (len < 8)
        *first8 = v;
    return mix(h ^ v ^ ((unsigned long long)len << 56));
}

static int
grow_table(word_slot **table, Py_ssize_t *cap, const unsigned char *arena, const Py_ssize_t *word_at)
{
    Py_ssize_t newcap = *cap * 2, i, j;
    word_slot *bigger = PyMem_Malloc((size_t)newcap * sizeof(word_slot)), *old = *table;
    unsigned long long first8;
    if (bigger == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < newcap; i++)
        bigger[i].index = -1;
    for (i = 0; i < *cap; i++) {
        if (old[i].index < 0)
            continue;
        j = (Py_ssize_t)(word_hash(arena + word_at[old[i].index], old[i].len, &first8)
                         & (unsigned long long)(newcap - 1));
        while (bigger[j].index >= 0)
            j = (j + 1) & (newcap - 1);
        bigger[j] = old[i];
    }
    PyMem_Free(old);
    *table = bigger;
    *cap = newcap;
    return 0;
}

/* Grow a PyMem buffer of `size` bytes to hold at least `need`. */
static int
reserve(unsigned char **buf, Py_ssize_t *size, Py_ssize_t need)
{
    unsigned char *bigger;
    Py_ssize_t newsize = *size ? *size : 4096;
    if (need <= *size)
        return 0;
    while (newsize < need)
        newsize *= 2;
    bigger = PyMem_Realloc(*buf, (size_t)newsize);
    if (bigger == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = bigger;
    *size = newsize;
    return 0;
}

static PyObject *
scan_texts(PyObject *self, PyObject *args)
{
    PyObject *texts, *seq, *words = NULL, *inv_obj = NULL, *firsts_obj = NULL, *result = NULL;
    Py_buffer tab;
    const unsigned char *map;
    unsigned char *scratch = NULL, *arena = NULL;
    Py_ssize_t nscratch = 0, narena = 0, arena_used = 0, ntexts, t, nwords = 0, cap_words = 0, cap = 4096, used = 0, i;
    word_slot *table = NULL;
    long long *inverse = NULL, *firsts = NULL;
    Py_ssize_t *word_at = NULL, cap_at = 1024;  /* each word's first byte in the arena */
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy*", &texts, &tab))
        return NULL;
    if (tab.len != 256) {
        PyErr_SetString(PyExc_ValueError, "the translation table is 256 bytes");
        PyBuffer_Release(&tab);
        return NULL;
    }
    map = (const unsigned char *)tab.buf;
    seq = PySequence_Fast(texts, "texts must be a sequence of str or bytes");
    if (seq == NULL) {
        PyBuffer_Release(&tab);
        return NULL;
    }
    ntexts = PySequence_Fast_GET_SIZE(seq);
    table = PyMem_Malloc((size_t)cap * sizeof(word_slot));
    firsts = PyMem_Malloc((size_t)(ntexts + 1) * sizeof(long long));
    word_at = PyMem_Malloc((size_t)cap_at * sizeof(Py_ssize_t));
    words = PyList_New(0);
    if (!table || !firsts || !word_at || !words) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < cap; i++)
        table[i].index = -1;
    for (t = 0; t < ntexts; t++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, t);
        const unsigned char *src;
        Py_ssize_t n, pos = 0;
        if (PyUnicode_Check(item) && PyUnicode_IS_ASCII(item)) {
            src = (const unsigned char *)PyUnicode_DATA(item);
            n = PyUnicode_GET_LENGTH(item);
        } else if (PyBytes_Check(item)) {
            src = (const unsigned char *)PyBytes_AS_STRING(item);
            n = PyBytes_GET_SIZE(item);
        } else {
            PyErr_SetString(PyExc_TypeError, "texts must be ASCII str or UTF-8 bytes");
            goto done;
        }
        firsts[t] = nwords;
        if (reserve(&scratch, &nscratch, n + 1) < 0)
            goto done;
        /* a word of two bytes or more and the space after it take three bytes */
        if (nwords + n / 2 + 1 > cap_words) {
            Py_ssize_t newcap = cap_words ? cap_words : 65536;
            long long *bigger;
            while (newcap < nwords + n / 2 + 1)
                newcap *= 2;
            bigger = PyMem_Realloc(inverse, (size_t)newcap * sizeof(long long));
            if (bigger == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            inverse = bigger;
            cap_words = newcap;
        }
        while (pos < n) {
            Py_ssize_t len = 0, slot, mask = cap - 1;
            /* word_hash's steps, taken while the bytes are copied (one pass over them) */
            unsigned long long h = 0x9E3779B97F4A7C15ULL, v = 0, first8 = 0;
            int k = 0;
            while (pos < n && map[src[pos]] == 0x20)
                pos++;
            while (pos < n) {  /* translate and copy the word's bytes */
                unsigned char c = map[src[pos]];
                if (c == 0x20)
                    break;
                scratch[len++] = c;
                pos++;
                v = (v << 8) | c;
                if (++k == 8) {
                    if (len == 8)
                        first8 = v;
                    h = (h ^ v) * 0xC2B2AE3D27D4EB4FULL;
                    h ^= h >> 29;
                    v = 0;
                    k = 0;
                }
            }
            if (len < 2)
                continue;
            if (len > 0x7FFFFFFF) {
                PyErr_SetString(PyExc_ValueError, "a word is too long");
                goto done;
            }
            if (len < 8)
                first8 = v;
            h = mix(h ^ v ^ ((unsigned long long)len << 56));
            slot = (Py_ssize_t)(h & (unsigned long long)mask);
            while (table[slot].index >= 0
                   && !(table[slot].first8 == first8 && table[slot].len == (unsigned int)len
                        && (len <= 8 || memcmp(arena + word_at[table[slot].index] + 8, scratch + 8, (size_t)(len - 8)) == 0)))
                slot = (slot + 1) & mask;
            if (table[slot].index < 0) {
                PyObject *word = PyUnicode_DecodeUTF8((const char *)scratch, len, "surrogatepass");
                if (word == NULL || PyList_Append(words, word) < 0) {
                    Py_XDECREF(word);
                    goto done;
                }
                Py_DECREF(word);
                if (reserve(&arena, &narena, arena_used + len) < 0)
                    goto done;
                if (used == cap_at) {
                    Py_ssize_t *bigger = PyMem_Realloc(word_at, (size_t)(2 * cap_at) * sizeof(Py_ssize_t));
                    if (bigger == NULL) {
                        PyErr_NoMemory();
                        goto done;
                    }
                    word_at = bigger;
                    cap_at *= 2;
                }
                memcpy(arena + arena_used, scratch, (size_t)len);
                word_at[used] = arena_used;
                table[slot].first8 = first8;
                table[slot].len = (unsigned int)len;
                table[slot].index = (int)used;
                arena_used += len;
                inverse[nwords++] = used++;
                if (used > 0x7FFFFFFE) {
                    PyErr_SetString(PyExc_ValueError, "too many distinct words");
                    goto done;
                }
                if (2 * used > cap && grow_table(&table, &cap, arena, word_at) < 0)  /* at most half full */
                    goto done;
                continue;
            }
            inverse[nwords++] = table[slot].index;
        }
    }
    firsts[ntexts] = nwords;
    inv_obj = PyBytes_FromStringAndSize((const char *)inverse, nwords * (Py_ssize_t)sizeof(long long));
    firsts_obj = PyBytes_FromStringAndSize((const char *)firsts, ntexts * (Py_ssize_t)sizeof(long long));
    if (inv_obj && firsts_obj)
        result = PyTuple_Pack(3, words, inv_obj, firsts_obj);
done:
    Py_XDECREF(words);
    Py_XDECREF(inv_obj);
    Py_XDECREF(firsts_obj);
    PyMem_Free(table);
    PyMem_Free(inverse);
    PyMem_Free(firsts);
    PyMem_Free(scratch);
    PyMem_Free(arena);
    PyMem_Free(word_at);
    Py_DECREF(seq);
    PyBuffer_Release(&tab);
    return result;
}

/* ---- node records: the common shape, msgpack-encoded --------------------------------- */

typedef struct {
    unsigned char *buf;
    Py_ssize_t len, cap;
} out_buf;

static int
out_put(out_buf *o, const void *data, Py_ssize_t n)
{
    if (o->len + n > o->cap && reserve(&o->buf, &o->cap, o->len + n) < 0)
        return -1;
    memcpy(o->buf + o->len, data, (size_t)n);
    o->len += n;
    return 0;
}

/* msgpack's str (use_bin_type=True: str8 allowed); 1 when the text does not encode
   (a lone surrogate: the caller's pure path raises msgpack's error) */
static int
pack_str(out_buf *o, PyObject *text)
{
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    unsigned char head[5];
    int h;
    if (utf8 == NULL) {
        PyErr_Clear();
        return 1;
    }
    if (n < 32) {
        head[0] = (unsigned char)(0xa0 | n);
        h = 1;
    } else if (n < 0x100) {
        head[0] = 0xd9;
        head[1] = (unsigned char)n;
        h = 2;
    } else if (n < 0x10000) {
        head[0] = 0xda;
        head[1] = (unsigned char)(n >> 8);
        head[2] = (unsigned char)n;
        h = 3;
    } else if ((unsigned long long)n <= 0xFFFFFFFFULL) {
        head[0] = 0xdb;
        head[1] = (unsigned char)(n >> 24);
        head[2] = (unsigned char)(n >> 16);
        head[3] = (unsigned char)(n >> 8);
        head[4] = (unsigned char)n;
        h = 5;
    } else {
        return 1;
    }
    return (out_put(o, head, h) < 0 || out_put(o, utf8, n) < 0) ? -1 : 0;
}

static int
pack_double(out_buf *o, double v)
{
    unsigned char b[9];
    unsigned long long bits;
    int i;
    memcpy(&bits, &v, 8);
    b[0] = 0xcb;
    for (i = 0; i < 8; i++)
        b[1 + i] = (unsigned char)(bits >> (56 - 8 * i));
    return out_put(o, b, 9);
}

/* The record of one node's instance dict in the common shape, or 1 when it is not (the
   caller's pure path encodes it); -1 on an error. */
static int
plain_record(out_buf *o, PyObject *values, PyObject *names, PyObject *defaults, Py_ssize_t threshold)
{
    PyObject *id, *content, *created, *last, *metadata, *embeddings, *spaces = NULL;
    Py_ssize_t i, nnames = PyTuple_GET_SIZE(names), nspaces;
    double c, l;
    int r;
    unsigned char head[3];
    if (!PyDict_CheckExact(values))
        return 1;
    for (i = 0; i < nnames; i++)  /* the other fields hold their default objects */
        if (PyDict_GetItemWithError(values, PyTuple_GET_ITEM(names, i)) != PyTuple_GET_ITEM(defaults, i))
            return PyErr_Occurred() ? -1 : 1;
    id = PyDict_GetItemWithError(values, key_id);
    content = PyDict_GetItemWithError(values, key_content);
    created = PyDict_GetItemWithError(values, key_created_at);
    last = PyDict_GetItemWithError(values, key_last_accessed);
    metadata = PyDict_GetItemWithError(values, key_metadata);
    embeddings = PyDict_GetItemWithError(values, key_embeddings);
    if (PyErr_Occurred())
        return -1;
    if (!id || !content || !created || !last || !metadata || !embeddings || !PyUnicode_CheckExact(id)
        || !PyUnicode_CheckExact(content) || PyUnicode_GET_LENGTH(content) == 0 || !PyFloat_CheckExact(created)
        || !PyFloat_CheckExact(last) || !PyDict_CheckExact(metadata) || PyDict_GET_SIZE(metadata) != 0
        || !PyDict_CheckExact(embeddings))
        return 1;
    c = PyFloat_AS_DOUBLE(created);
    l = PyFloat_AS_DOUBLE(last);
    if (l != c || (l == 0.0 && signbit(l) != signbit(c)))  /* last_accessed at its default: created_at */
        return 1;
    nspaces = PyDict_GET_SIZE(embeddings);
    if (nspaces) {
        spaces = PyDict_Keys(embeddings);
        if (spaces == NULL)
            return -1;
        for (i = 0; i < nspaces; i++)
            if (!PyUnicode_CheckExact(PyList_GET_ITEM(spaces, i)) || nspaces > 15) {
                Py_DECREF(spaces);
                return 1;
            }
        if (PyList_Sort(spaces) < 0) {
            Py_DECREF(spaces);
            return -1;
        }
    }
    /* codec byte 1 (msgpack), [3, mask, id, created_at, content(, spaces)] */
    head[0] = 1;
    head[1] = (unsigned char)(0x90 | (nspaces ? 6 : 5));
    head[2] = 3;
    r = out_put(o, head, 3);
    head[0] = nspaces ? 3 : 1;
    if (r == 0)
        r = out_put(o, head, 1);
    if (r == 0)
        r = pack_str(o, id);
    if (r == 0)
        r = pack_double(o, c);
    if (r == 0)
        r = pack_str(o, content);
    if (r == 0 && nspaces) {
        head[0] = (unsigned char)(0x90 | nspaces);
        r = out_put(o, head, 1);
        for (i = 0; r == 0 && i < nspaces; i++)
            r = pack_str(o, PyList_GET_ITEM(spaces, i));
    }
    Py_XDECREF(spaces);
    if (r == 0 && o->len - 1 > threshold)  /* the body is zstd-compressed: the pure path's job */
        r = 1;
    return r;
}

static PyObject *
plain_records(PyObject *self, PyObject *args)
{
    PyObject *dicts, *names, *defaults, *seq, *out = NULL;
    Py_ssize_t threshold, n, i;
    out_buf o = {NULL, 0, 0};
    (void)self;
    if (!PyArg_ParseTuple(args, "OO!O!n", &dicts, &PyTuple_Type, &names, &PyTuple_Type, &defaults, &threshold))
        return NULL;
    if (PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(defaults)) {
        PyErr_SetString(PyExc_ValueError, "one default per name");
        return NULL;
    }
    seq = PySequence_Fast(dicts, "a sequence of dicts");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        PyObject *b;
        int r;
        o.len = 0;
        r = plain_record(&o, PySequence_Fast_GET_ITEM(seq, i), names, defaults, threshold);
        if (r < 0) {
            Py_CLEAR(out);
            goto done;
        }
        if (r > 0) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(out, i, Py_None);
            continue;
        }
        b = PyBytes_FromStringAndSize((const char *)o.buf, o.len);
        if (b == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, b);
    }
done:
    PyMem_Free(o.buf);
    Py_DECREF(seq);
    return out;
}

/* ---- node objects of a validated batch ------------------------------------------------ */

/* columns_pass(rows, specs) -> bool: engramdb/records.py's _columns_pass once the first
 * row's keys are known to be checkable. specs holds (name, kind, limit) for every key of the
 * first row; a row passes when it is exactly a dict with that many keys, all of them, and
 * each value fits its kind: -1 any (a column checked elsewhere), 0 an exact str of at most
 * `limit` code points (no limit when limit < 0), 1 an exact non-empty str of at most
 * `limit` code points, 2 an exact finite float, 3 an exact finite float in [0, 1]. */
#define MAX_SPECS 64

static PyObject *
columns_pass(PyObject *self, PyObject *args)
{
    PyObject *rows, *specs, *seq, *names[MAX_SPECS];
    long kinds[MAX_SPECS];
    Py_ssize_t limits[MAX_SPECS], nspecs, n, i, j;
    int ok = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO!", &rows, &PyTuple_Type, &specs))
        return NULL;
    nspecs = PyTuple_GET_SIZE(specs);
    if (nspecs > MAX_SPECS) {
        PyErr_SetString(PyExc_ValueError, "too many columns");
        return NULL;
    }
    for (j = 0; j < nspecs; j++) {
        PyObject *spec = PyTuple_GET_ITEM(specs, j);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3) {
            PyErr_SetString(PyExc_TypeError, "specs must be (name, kind, limit) tuples");
            return NULL;
        }
        names[j] = PyTuple_GET_ITEM(spec, 0);
        kinds[j] = PyLong_AsLong(PyTuple_GET_ITEM(spec, 1));
        limits[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
        if (PyErr_Occurred())
            return NULL;
    }
    seq = PySequence_Fast(rows, "rows must be a sequence");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    for (i = 0; i < n && ok; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyDict_CheckExact(row) || PyDict_GET_SIZE(row) != nspecs) {
            ok = 0;
            break;
        }
        for (j = 0; j < nspecs; j++) {
            PyObject *v = PyDict_GetItemWithError(row, names[j]);
            if (v == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(seq);
                    return NULL;
                }
                ok = 0;
                break;
            }
            switch (kinds[j]) {
            case -1:
                break;
            case 0:
            case 1:
                if (!PyUnicode_CheckExact(v) || (limits[j] >= 0 && PyUnicode_GET_LENGTH(v) > limits[j])
                    || (kinds[j] == 1 && PyUnicode_GET_LENGTH(v) == 0))
                    ok = 0;
                break;
            case 2:
            case 3:
                if (!PyFloat_CheckExact(v) || !isfinite(PyFloat_AS_DOUBLE(v))
                    || (kinds[j] == 3 && !(PyFloat_AS_DOUBLE(v) >= 0.0 && PyFloat_AS_DOUBLE(v) <= 1.0)))
                    ok = 0;
                break;
            default:
                ok = 0;
            }
            if (!ok)
                break;
        }
    }
    Py_DECREF(seq);
    return PyBool_FromLong(ok);
}

static PyObject *
new_nodes(PyObject *self, PyObject *args)
{
    PyObject *cls, *defaults, *rows, *vectors, *seq = NULL, *vseq = NULL, *empty = NULL, *out = NULL;
    Py_ssize_t n, i;
    PyTypeObject *type;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &cls, &PyDict_Type, &defaults, &rows, &vectors))
        return NULL;
    type = (PyTypeObject *)cls;
    if (type->tp_new == NULL || !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || type->tp_dictoffset == 0) {
        PyErr_SetString(PyExc_TypeError, "cls must be a Python class whose instances have a __dict__");
        return NULL;
    }
    seq = PySequence_Fast(rows, "rows must be a sequence of dicts");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (vectors != Py_None) {
        vseq = PySequence_Fast(vectors, "vectors must be a sequence or None");
        if (vseq == NULL)
            goto done;
        if (PySequence_Fast_GET_SIZE(vseq) != n) {
            PyErr_SetString(PyExc_ValueError, "one vectors dict per row");
            goto done;
        }
    }
    empty = PyTuple_New(0);
    out = PyList_New(n);
    if (empty == NULL || out == NULL)
        goto fail;
    for (i = 0; i < n; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, i), *obj, *d, *m, *e;
        if (!PyDict_Check(row)) {
            PyErr_SetString(PyExc_TypeError, "rows must be dicts");
            goto fail;
        }
        obj = type->tp_new(type, empty, NULL);  /* cls.__new__(cls) */
        if (obj == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, obj);
        d = PyDict_Copy(defaults);  /* a copy of the defaults' table: no resizing as it fills */
        if (d == NULL)
            goto fail;
        m = PyDict_New();
        e = vseq ? NULL : PyDict_New();
        if (m == NULL || (vseq == NULL && e == NULL) || PyObject_GenericSetDict(obj, d, NULL) < 0
            || PyDict_SetItem(d, key_metadata, m) < 0
            || PyDict_SetItem(d, key_embeddings, vseq ? Py_None : e) < 0 || PyDict_Update(d, row) < 0
            || (vseq && PyDict_SetItem(d, key_embeddings, PySequence_Fast_GET_ITEM(vseq, i)) < 0)) {
            Py_XDECREF(m);
            Py_XDECREF(e);
            Py_DECREF(d);
            goto fail;
        }
        Py_DECREF(m);
        Py_XDECREF(e);
        Py_DECREF(d);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(empty);
    Py_XDECREF(vseq);
    Py_DECREF(seq);
    return out;
}

/* ---- posting blocks ------------------------------------------------------------------ */

static int
width_of(unsigned long long max)
{
    return max < (1ULL << 8) ? 1 : max < (1ULL << 16) ? 2 : max < (1ULL << 32) ? 4 : 8;
}

static void
put_le(unsigned char *p, unsigned long long v, int w)
{
    int i;
    for (i = 0; i < w; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static PyObject *
posting_blocks(PyObject *self, PyObject *args)
{
    Py_buffer db, vb, bb;
    const unsigned long long *docnos, *values;
    const long long *bounds;
    Py_ssize_t nrows, nblocks, j, zmin;
    PyObject *out = NULL, *zidx = NULL, *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*n", &db, &vb, &bb, &zmin))
        return NULL;
    docnos = (const unsigned long long *)db.buf;
    values = (const unsigned long long *)vb.buf;
    bounds = (const long long *)bb.buf;
    nrows = db.len / 8;
    nblocks = bb.len / 8 - 1;
    if (vb.len != db.len || nblocks < 0) {
        PyErr_SetString(PyExc_ValueError, "two columns of equal length and at least one bound");
        goto done;
    }
    out = PyList_New(nblocks);
    zidx = PyList_New(0);
    if (out == NULL || zidx == NULL)
        goto fail;
    for (j = 0; j < nblocks; j++) {
        Py_ssize_t a = (Py_ssize_t)bounds[j], b = (Py_ssize_t)bounds[j + 1], count = b - a, i, size;
        unsigned long long maxd = 0, maxv = 0, prev = 0;
        int dw, vw, zstd;
        unsigned char *p;
        PyObject *block;
        if (a < 0 || b < a || b > nrows) {
            PyErr_SetString(PyExc_ValueError, "bounds must be ascending row positions");
            goto fail;
        }
        for (i = a; i < b; i++) {
            unsigned long long d = docnos[i] - prev;
            if (i > a && docnos[i] <= prev) {  /* not strictly increasing: the caller's pure path says so */
                Py_INCREF(Py_None);
                Py_DECREF(out);
                Py_DECREF(zidx);
                PyBuffer_Release(&db);
                PyBuffer_Release(&vb);
                PyBuffer_Release(&bb);
                return Py_None;
            }
            if (i == a)
                d = docnos[i];
            if (d > maxd)
                maxd = d;
            if (values[i] > maxv)
                maxv = values[i];
            prev = docnos[i];
        }
        dw = count ? width_of(maxd) : 1;
        vw = count ? width_of(maxv) : 1;
        size = count * (dw + vw);
        zstd = count && size >= zmin;
        block = PyBytes_FromStringAndSize(NULL, 7 + size);
        if (block == NULL)
            goto fail;
        PyList_SET_ITEM(out, j, block);
        p = (unsigned char *)PyBytes_AS_STRING(block);
        p[0] = (unsigned char)(zstd ? 2 : 1);  /* BLOCK_ZSTD (compressed by the caller) or BLOCK_RAW */
        put_le(p + 1, (unsigned long long)count, 4);
        p[5] = (unsigned char)dw;
        p[6] = (unsigned char)vw;
        p += 7;
        prev = 0;
        for (i = a; i < b; i++, p += dw) {
            put_le(p, i == a ? docnos[i] : docnos[i] - prev, dw);
            prev = docnos[i];
        }
        for (i = a; i < b; i++, p += vw)
            put_le(p, values[i], vw);
        if (zstd) {
            PyObject *at = PyLong_FromSsize_t(j);
            if (at == NULL || PyList_Append(zidx, at) < 0) {
                Py_XDECREF(at);
                goto fail;
            }
            Py_DECREF(at);
        }
    }
    result = PyTuple_Pack(2, out, zidx);
fail:
    Py_XDECREF(out);
    Py_XDECREF(zidx);
done:
    PyBuffer_Release(&db);
    PyBuffer_Release(&vb);
    PyBuffer_Release(&bb);
    return result;
}

/* ---- a segment's postings ------------------------------------------------------------ */

static PyObject *
count_postings(PyObject *self, PyObject *args)
{
    Py_buffer tb, lb, ob, db;
    const long long *term_ids, *lengths, *order;
    const unsigned long long *docnos;
    Py_ssize_t ntok, ndocs, nterms, i, j, total = 0;
    long long *starts = NULL, *fill = NULL, *tok_at = NULL;
    Py_ssize_t *last = NULL;
    unsigned long long *out_docs = NULL;
    long long *out_tfs = NULL;
    PyObject *docs_obj = NULL, *tfs_obj = NULL, *bounds_obj = NULL, *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*y*n", &tb, &lb, &ob, &db, &nterms))
        return NULL;
    term_ids = (const long long *)tb.buf;
    lengths = (const long long *)lb.buf;
    order = (const long long *)ob.buf;
    docnos = (const unsigned long long *)db.buf;
    ntok = tb.len / 8;
    ndocs = lb.len / 8;
    if (ob.len / 8 != ndocs || db.len / 8 != ndocs || nterms < 0) {
        PyErr_SetString(PyExc_ValueError, "one length, order entry and docno per document");
        goto done;
    }
    starts = PyMem_Malloc((size_t)(nterms + 1) * sizeof(long long));
    fill = PyMem_Malloc((size_t)(nterms + 1) * sizeof(long long));
    last = PyMem_Malloc((size_t)(nterms + 1) * sizeof(Py_ssize_t));
    tok_at = PyMem_Malloc((size_t)(ndocs + 1) * sizeof(long long));
    if (!starts || !fill || !last || !tok_at) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < ndocs; i++) {  /* each document's first token */
        if (lengths[i] < 0 || total + lengths[i] > ntok) {
            PyErr_SetString(PyExc_ValueError, "the lengths do not add up to the tokens");
            goto done;
        }
        tok_at[i] = total;
        total += lengths[i];
    }
    if (total != ntok) {
        PyErr_SetString(PyExc_ValueError, "the lengths do not add up to the tokens");
        goto done;
    }
    for (j = 0; j <= nterms; j++) {
        starts[j] = 0;
        last[j] = -1;
    }
    /* pass 1: each term's number of documents */
    for (i = 0; i < ndocs; i++) {
        Py_ssize_t d = (Py_ssize_t)order[i], a, b, k;
        if (d < 0 || d >= ndocs) {
            PyErr_SetString(PyExc_ValueError, "order is not a permutation of the documents");
            goto done;
        }
        a = (Py_ssize_t)tok_at[d];
        b = a + (Py_ssize_t)lengths[d];
        for (k = a; k < b; k++) {
            long long t = term_ids[k];
            if (t < 0 || t >= nterms) {
                PyErr_SetString(PyExc_ValueError, "a term id is out of range");
                goto done;
            }
            if (last[t] != i) {
                last[t] = i;
                starts[t + 1]++;
            }
        }
    }
    for (j = 0; j < nterms; j++)
        starts[j + 1] += starts[j];
    out_docs = PyMem_Malloc((size_t)(starts[nterms] + 1) * sizeof(unsigned long long));
    out_tfs = PyMem_Malloc((size_t)(starts[nterms] + 1) * sizeof(long long));
    if (!out_docs || !out_tfs) {
        PyErr_NoMemory();
        goto done;
    }
    for (j = 0; j < nterms; j++) {
        fill[j] = starts[j];
        last[j] = -1;
    }
    /* pass 2: documents in docno order, so each term's postings come out in docno order */
    for (i = 0; i < ndocs; i++) {
        Py_ssize_t d = (Py_ssize_t)order[i], a = (Py_ssize_t)tok_at[d], b = a + (Py_ssize_t)lengths[d], k;
        for (k = a; k < b; k++) {
            long long t = term_ids[k];
            if (last[t] != i) {
                last[t] = i;
                out_docs[fill[t]] = docnos[d];
                out_tfs[fill[t]++] = 1;
            } else {
                out_tfs[fill[t] - 1]++;
            }
        }
    }
    docs_obj = PyBytes_FromStringAndSize((const char *)out_docs, (Py_ssize_t)starts[nterms] * 8);
    tfs_obj = PyBytes_FromStringAndSize((const char *)out_tfs, (Py_ssize_t)starts[nterms] * 8);
    bounds_obj = PyBytes_FromStringAndSize((const char *)starts, (nterms + 1) * 8);
    if (docs_obj && tfs_obj && bounds_obj)
        result = PyTuple_Pack(3, docs_obj, tfs_obj, bounds_obj);
done:
    Py_XDECREF(docs_obj);
    Py_XDECREF(tfs_obj);
    Py_XDECREF(bounds_obj);
    PyMem_Free(starts);
    PyMem_Free(fill);
    PyMem_Free(last);
    PyMem_Free(tok_at);
    PyMem_Free(out_docs);
    PyMem_Free(out_tfs);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    return result;
}

static PyObject *
keep_tokens(PyObject *self, PyObject *args)
{
    Py_buffer inv, fst, val;
    const long long *inverse, *firsts, *values;
    Py_ssize_t ntok, ntexts, nvalues, t, j, kept = 0;
    long long *ids = NULL, *lengths = NULL;
    PyObject *ids_obj = NULL, *lengths_obj = NULL, *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*", &inv, &fst, &val))
        return NULL;
    inverse = (const long long *)inv.buf;
    firsts = (const long long *)fst.buf;
    values = (const long long *)val.buf;
    ntok = inv.len / (Py_ssize_t)sizeof(long long);
    ntexts = fst.len / (Py_ssize_t)sizeof(long long);
    nvalues = val.len / (Py_ssize_t)sizeof(long long);
    ids = PyMem_Malloc((size_t)(ntok + 1) * sizeof(long long));
    lengths = PyMem_Malloc((size_t)(ntexts + 1) * sizeof(long long));
    if (!ids || !lengths) {
        PyErr_NoMemory();
        goto done;
    }
    for (t = 0; t < ntexts; t++) {
        Py_ssize_t a = (Py_ssize_t)firsts[t], b = t + 1 < ntexts ? (Py_ssize_t)firsts[t + 1] : ntok, before = kept;
        if (a < 0 || b < a || b > ntok) {
            PyErr_SetString(PyExc_ValueError, "firsts must be ascending token positions");
            goto done;
        }
        for (j = a; j < b; j++) {
            long long w = inverse[j], v;
            if (w < 0 || w >= nvalues) {
                PyErr_SetString(PyExc_ValueError, "a token's word number is out of range");
                goto done;
            }
            v = values[w];
            if (v >= 0)
                ids[kept++] = v;
        }
        lengths[t] = kept - before;
    }
    ids_obj = PyBytes_FromStringAndSize((const char *)ids, kept * (Py_ssize_t)sizeof(long long));
    lengths_obj = PyBytes_FromStringAndSize((const char *)lengths, ntexts * (Py_ssize_t)sizeof(long long));
    if (ids_obj && lengths_obj)
        result = PyTuple_Pack(2, ids_obj, lengths_obj);
done:
    Py_XDECREF(ids_obj);
    Py_XDECREF(lengths_obj);
    PyMem_Free(ids);
    PyMem_Free(lengths);
    PyBuffer_Release(&inv);
    PyBuffer_Release(&fst);
    PyBuffer_Release(&val);
    return result;
}

/* ---- BM25 top(): one posting run's contributions into the accumulator ----------------- */

/* PyObject_GetBuffer, 1 on success. A refusal of the object or of its layout becomes a
 * TypeError naming the caller ``fn`` and the argument ``what``: TypeError (no buffer),
 * BufferError (e.g. bytes asked to be writable) and ValueError (numpy's answer for an array
 * that is not C-contiguous or is read-only). Anything else (MemoryError, an error in a
 * third-party exporter) propagates as raised, 0 returned. */
static int
get_buffer(PyObject *obj, Py_buffer *buf, int flags, const char *fn, const char *what)
{
    if (PyObject_GetBuffer(obj, buf, flags) == 0)
        return 1;
    if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_BufferError)
            || PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a C-contiguous%s array", fn, what,
                     (flags & PyBUF_WRITABLE) ? " writable" : "");
    }
    return 0;
}

/* A 1-d C-contiguous buffer's element kind: 'f' float64, 'i' signed or 'u' unsigned
 * integer (its width in *size), 0 with TypeError set for anything else. ``fn``: the
 * calling function's name, for the message. */
static int
buffer_kind(Py_buffer *b, const char *fn, const char *what)
{
    const char *f = b->format ? b->format : "B";
    char c;
    if (*f == '<' || *f == '=' || *f == '@')  /* native byte order only */
        f++;
    c = f[0];
    if (b->ndim != 1 || (c && f[1])) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a 1-d array of one native number type", fn, what);
        return 0;
    }
    if (c == 'd' && b->itemsize == 8)
        return 'f';
    if (c && strchr("bhilq", c) && (b->itemsize == 1 || b->itemsize == 2 || b->itemsize == 4 || b->itemsize == 8))
        return 'i';
    if (c && strchr("BHILQ", c) && (b->itemsize == 1 || b->itemsize == 2 || b->itemsize == 4 || b->itemsize == 8))
        return 'u';
    PyErr_Format(PyExc_TypeError, "%s: %s has an unsupported dtype (format '%s')", fn, what,
                 b->format ? b->format : "B");
    return 0;
}

/* The largest element of an integer buffer; -1 (with ValueError set) when one is negative. */
static int
index_max(const Py_buffer *b, int kind, Py_ssize_t n, unsigned long long *out, const char *fn, const char *what)
{
    unsigned long long m = 0;
    long long low = 0;
    Py_ssize_t i;
#define INDEX_MAX(T) for (i = 0; i < n; i++) { T v = ((const T *)b->buf)[i]; \
                         if ((long long)v < low) low = (long long)v; \
                         if ((unsigned long long)v > m) m = (unsigned long long)v; }
    if (kind == 'u') {
        switch (b->itemsize) {
        case 1: INDEX_MAX(unsigned char) break;
        case 2: INDEX_MAX(unsigned short) break;
        case 4: INDEX_MAX(unsigned int) break;
        default: for (i = 0; i < n; i++) { unsigned long long v = ((const unsigned long long *)b->buf)[i];
                                           if (v > m) m = v; }
        }
    } else {
        switch (b->itemsize) {
        case 1: INDEX_MAX(signed char) break;
        case 2: INDEX_MAX(short) break;
        case 4: INDEX_MAX(int) break;
        default: INDEX_MAX(long long)
        }
    }
#undef INDEX_MAX
    if (low < 0) {
        PyErr_Format(PyExc_ValueError, "%s: %s holds a negative index", fn, what);
        return -1;
    }
    *out = m;
    return 0;
}

/* acc[docnos[i]] += values[codes[i]] (values[i] when codes is None) for every i, in order:
 * each addition is one IEEE float64 addition, the same one numpy's `acc[docnos] += x` does
 * per element, so when the docnos are distinct (as in one posting run) the result is bit
 * for bit numpy's. (With a repeated docno numpy adds once and this adds twice: callers
 * pass distinct docnos.) All indexes are checked before acc is touched. */
static PyObject *
accumulate(PyObject *self, PyObject *args)
{
    PyObject *acc_obj, *doc_obj, *val_obj, *code_obj;
    Py_buffer ab = {0}, db = {0}, vb = {0}, cb = {0};
    int have_a = 0, have_d = 0, have_v = 0, have_c = 0, dk, ck = 0;
    Py_ssize_t n, nacc, nval, i;
    unsigned long long dmax = 0, cmax = 0;
    double *acc;
    const double *values;
    const void *d, *c = NULL;
    PyObject *result = NULL;
    const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOO", &acc_obj, &doc_obj, &val_obj, &code_obj))
        return NULL;
#define GET(obj, buf, have, fl, what) \
    if (!get_buffer(obj, &buf, fl, "accumulate", what)) \
        goto done; \
    have = 1;
    GET(acc_obj, ab, have_a, flags | PyBUF_WRITABLE, "acc")
    GET(doc_obj, db, have_d, flags, "docnos")
    GET(val_obj, vb, have_v, flags, "values")
    if (code_obj != Py_None) {
        GET(code_obj, cb, have_c, flags, "codes")
    }
#undef GET
    if (buffer_kind(&ab, "accumulate", "acc") != 'f' || buffer_kind(&vb, "accumulate", "values") != 'f') {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "accumulate: acc and values must be float64");
        goto done;
    }
    dk = buffer_kind(&db, "accumulate", "docnos");
    if (have_c)
        ck = buffer_kind(&cb, "accumulate", "codes");
    if (dk == 0 || (have_c && ck == 0))
        goto done;
    if (dk == 'f' || ck == 'f') {
        PyErr_SetString(PyExc_TypeError, "accumulate: docnos and codes must be integer arrays");
        goto done;
    }
    n = db.shape[0];
    nacc = ab.shape[0];
    nval = vb.shape[0];
    if (have_c ? cb.shape[0] != n : nval != n) {
        PyErr_SetString(PyExc_ValueError, have_c ? "accumulate: one code per docno" : "accumulate: one value per docno");
        goto done;
    }
    if (index_max(&db, dk, n, &dmax, "accumulate", "docnos") < 0 || (have_c && index_max(&cb, ck, n, &cmax, "accumulate", "codes") < 0))
        goto done;
    if (n > 0 && dmax >= (unsigned long long)nacc) {
        PyErr_SetString(PyExc_ValueError, "accumulate: a docno is beyond the accumulator");
        goto done;
    }
    if (have_c && n > 0 && cmax >= (unsigned long long)nval) {
        PyErr_SetString(PyExc_ValueError, "accumulate: a code is beyond the values");
        goto done;
    }
    acc = (double *)ab.buf;
    values = (const double *)vb.buf;
    d = db.buf;
    c = have_c ? cb.buf : NULL;
    /* indexes are checked non-negative, so a signed one reads as its unsigned width */
#define ACC_CODES(DT) \
    if (!have_c) { for (i = 0; i < n; i++) acc[((const DT *)d)[i]] += values[i]; } \
    else switch (cb.itemsize) { \
    case 1: for (i = 0; i < n; i++) acc[((const DT *)d)[i]] += values[((const unsigned char *)c)[i]]; break; \
    case 2: for (i = 0; i < n; i++) acc[((const DT *)d)[i]] += values[((const unsigned short *)c)[i]]; break; \
    case 4: for (i = 0; i < n; i++) acc[((const DT *)d)[i]] += values[((const unsigned int *)c)[i]]; break; \
    default: for (i = 0; i < n; i++) acc[((const DT *)d)[i]] += values[((const unsigned long long *)c)[i]]; }
    switch (db.itemsize) {
    case 1: ACC_CODES(unsigned char) break;
    case 2: ACC_CODES(unsigned short) break;
    case 4: ACC_CODES(unsigned int) break;
    default: ACC_CODES(unsigned long long)
    }
#undef ACC_CODES
    Py_INCREF(Py_None);
    result = Py_None;
done:
    if (have_a) PyBuffer_Release(&ab);
    if (have_d) PyBuffer_Release(&db);
    if (have_v) PyBuffer_Release(&vb);
    if (have_c) PyBuffer_Release(&cb);
    return result;
}

/* pair_values(out, groups, avgdl, k1, b): BM25 term parts (engramdb/index/bm25.py's _part) of
 * each group (tf, dl, idf, w), tf and dl float64 arrays of one length and idf, w floats, written
 * one group after another into out (float64, the groups' total length). The same float64
 * operations in the same order as _part's numpy calls, one rounding each (setup.py builds with
 * -ffp-contract=off, so no fused multiply-add merges two of them): the same bits:
 *     x = dl * b; x = x / avgdl; x = x + (1 - b); x = x * k1; x = x + tf; x = tf / x; x = x * idf;
 *     x = x * w (when w != 1; multiplying by 1 is exact either way). */
static PyObject *
pair_values(PyObject *self, PyObject *args)
{
    PyObject *out_obj, *groups, *seq = NULL, *result = NULL;
    Py_buffer ob = {0};
    int have_o = 0;
    double avgdl, k1, b, shift;
    Py_ssize_t at = 0, g, ng, nout;
    double *out;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOddd", &out_obj, &groups, &avgdl, &k1, &b))
        return NULL;
    if (!get_buffer(out_obj, &ob, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE, "pair_values", "out"))
        return NULL;
    have_o = 1;
    if (buffer_kind(&ob, "pair_values", "out") != 'f') {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "pair_values: out must be float64");
        goto done;
    }
    seq = PySequence_Fast(groups, "pair_values: groups must be a sequence");
    if (seq == NULL)
        goto done;
    out = (double *)ob.buf;
    nout = ob.shape[0];
    shift = 1.0 - b;
    ng = PySequence_Fast_GET_SIZE(seq);
    for (g = 0; g < ng; g++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, g);
        Py_buffer tb = {0}, db = {0};
        double idf, w;
        const double *tf, *dl;
        Py_ssize_t n, i;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_TypeError, "pair_values: a group is a (tf, dl, idf, w) tuple");
            goto done;
        }
        idf = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 2));
        w = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 3));
        if ((idf == -1.0 || w == -1.0) && PyErr_Occurred())
            goto done;
        if (!get_buffer(PyTuple_GET_ITEM(item, 0), &tb, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS, "pair_values", "tf"))
            goto done;
        if (!get_buffer(PyTuple_GET_ITEM(item, 1), &db, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS, "pair_values", "dl")) {
            PyBuffer_Release(&tb);
            goto done;
        }
        if (buffer_kind(&tb, "pair_values", "tf") != 'f' || buffer_kind(&db, "pair_values", "dl") != 'f' || tb.shape[0] != db.shape[0]
                || tb.shape[0] > nout - at) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "pair_values: tf and dl must be float64 arrays of one length, "
                                                  "fitting in out");
            PyBuffer_Release(&tb);
            PyBuffer_Release(&db);
            goto done;
        }
        n = tb.shape[0];
        tf = (const double *)tb.buf;
        dl = (const double *)db.buf;
        for (i = 0; i < n; i++) {
            double x = dl[i] * b;
            x = x / avgdl;
            x = x + shift;
            x = x * k1;
            x = x + tf[i];
            x = tf[i] / x;
            x = x * idf;
            if (w != 1.0)
                x = x * w;
            out[at + i] = x;
        }
        at += n;
        PyBuffer_Release(&tb);
        PyBuffer_Release(&db);
    }
    if (at != nout) {
        PyErr_SetString(PyExc_ValueError, "pair_values: out is longer than the groups");
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(seq);
    if (have_o) PyBuffer_Release(&ob);
    return result;
}

static PyObject *frontier_best(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *best_runs(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *concat_postings(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *term_holders(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *idf_values(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *term_values(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *fresh_delta(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *top_terms(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *query_top(PyObject *self, PyObject *args);  /* at the end of the file */
static PyObject *query_found(PyObject *self, PyObject *args);  /* at the end of the file */

static PyMethodDef methods[] = {
    {"seal_many", seal_many, METH_VARARGS, "AES-256-GCM envelopes of (key, plaintext) items (see the module comment)."},
    {"hmac_many", hmac_many, METH_VARARGS, "HMAC-SHA256(key, head | v)[:size] of each value v."},
    {"state_sum", state_sum, METH_VARARGS, "The sum of the state-digest terms of (key, envelope) pairs, mod 2**256, "
                                           "as 32 big-endian bytes."},
    {"scan_texts", scan_texts, METH_VARARGS, "The bulk tokenizer's word scan: (words, inverse, firsts)."},
    {"plain_records", plain_records, METH_VARARGS, "Node records of the common shape (see the module comment)."},
    {"columns_pass", columns_pass, METH_VARARGS, "Whether rows pass records.py's column checks (see columns_pass)."},
    {"new_nodes", new_nodes, METH_VARARGS, "Node objects of validated rows (see the module comment)."},
    {"posting_blocks", posting_blocks, METH_VARARGS, "BM25 posting blocks before compression (see the module comment)."},
    {"count_postings", count_postings, METH_VARARGS, "A segment's postings by counting (see the module comment)."},
    {"keep_tokens", keep_tokens, METH_VARARGS, "The kept tokens' values and each text's count: (ids, lengths)."},
    {"accumulate", accumulate, METH_VARARGS, "acc[docnos[i]] += values[codes[i]] (or values[i]): BM25 top()'s add."},
    {"pair_values", pair_values, METH_VARARGS, "BM25 term parts of (tf, dl, idf, w) groups into out (see pair_values)."},
    {"frontier_best", frontier_best, METH_VARARGS, "A BM25 posting run's k best from its frontier (see frontier_best)."},
    {"best_runs", best_runs, METH_VARARGS, "The k best (docno, value) of BM25 posting runs (see best_runs)."},
    {"concat_postings", concat_postings, METH_VARARGS, "BM25 posting blocks' columns, one after another (see concat_postings)."},
    {"term_holders", term_holders, METH_VARARGS, "A BM25 term's small holders and their tombstones (see term_holders)."},
    {"idf_values", idf_values, METH_VARARGS, "BM25 idfs with numpy's own log1p loop (see idf_values)."},
    {"term_values", term_values, METH_VARARGS, "A query's BM25 idfs and term parts in one call (see term_values)."},
    {"fresh_delta", fresh_delta, METH_VARARGS, "A BM25 delta grown by this handle's new segments (see fresh_delta)."},
    {"top_terms", top_terms, METH_VARARGS, "BM25 top()'s adds and selection for two or more terms (see top_terms)."},
    {"query_top", query_top, METH_VARARGS, "BM25 _Term.of and top() for two or more terms in one call (see query_top)."},
    {"query_found", query_found, METH_VARARGS, "BM25 _found: a query's (postings, weight), warm terms in C (see query_found)."},
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
    key_id = PyUnicode_InternFromString("id");
    key_content = PyUnicode_InternFromString("content");
    key_created_at = PyUnicode_InternFromString("created_at");
    key_last_accessed = PyUnicode_InternFromString("last_accessed");
    key_metadata = PyUnicode_InternFromString("metadata");
    key_embeddings = PyUnicode_InternFromString("embeddings");
    if (!key_id || !key_content || !key_created_at || !key_last_accessed || !key_metadata || !key_embeddings)
        return NULL;
    if (sha256_md == NULL || gcm_cipher == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256 or AES-256-GCM");
        return NULL;
    }
    return PyModule_Create(&module);
}

/* frontier_best(values, front, sizes, starts, docnos, rest, k, out_docnos, out_values) -> int
 * engramdb/index/bm25.py's _Run._frontier_best: the k best (docno, value) of a posting run from
 * its frontier. `front` (int64) are the frontier's pair codes, pair p holding sizes[p] postings
 * whose docnos are docnos[starts[p]:starts[p] + sizes[p]], increasing; `rest` (int64) the run's
 * other pair codes; `values` (float64) the value per pair code. Ranks the frontier's pairs by
 * value (descending, then position); the k-th best posting's value is kth. Returns -1 when the
 * frontier holds fewer than k postings or a pair of `rest` is worth kth or more (the frontier
 * cannot tell the answer: the caller ranks the whole run). Else writes the k best into
 * out_docnos (the dtype of docnos) and out_values (float64), value descending then docno
 * ascending, and returns k: every posting of the pairs worth more than kth, then the lowest
 * docnos of those worth kth (comparisons only, no arithmetic on values: the same values and
 * order as numpy's top_k over the whole run). Values are finite (BM25 parts). */
typedef struct { double v; Py_ssize_t i; } fb_pair;

static int
fb_pair_cmp(const void *a, const void *b)
{
    const fb_pair *x = (const fb_pair *)a, *y = (const fb_pair *)b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : (x->i > y->i);
}

static int
fb_docno_cmp(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : (x > y);
}

static unsigned long long
fb_read(const Py_buffer *b, int kind, Py_ssize_t i)
{
    const char *p = (const char *)b->buf;
    switch (b->itemsize) {
    case 1: return kind == 'i' ? (unsigned long long)(long long)((const signed char *)p)[i] : ((const unsigned char *)p)[i];
    case 2: return kind == 'i' ? (unsigned long long)(long long)((const short *)p)[i] : ((const unsigned short *)p)[i];
    case 4: return kind == 'i' ? (unsigned long long)(long long)((const int *)p)[i] : ((const unsigned int *)p)[i];
    default: return ((const unsigned long long *)p)[i];
    }
}

static void
fb_write(Py_buffer *b, Py_ssize_t i, unsigned long long v)
{
    char *p = (char *)b->buf;
    switch (b->itemsize) {
    case 1: ((unsigned char *)p)[i] = (unsigned char)v; break;
    case 2: ((unsigned short *)p)[i] = (unsigned short)v; break;
    case 4: ((unsigned int *)p)[i] = (unsigned int)v; break;
    default: ((unsigned long long *)p)[i] = v;
    }
}

static PyObject *
frontier_best(PyObject *self, PyObject *args)
{
    PyObject *objs[8];
    Py_buffer bufs[8];
    int have[8] = {0}, kinds[8] = {0}, b;
    static const char *names[8] = {"values", "front", "sizes", "starts", "docnos", "rest", "out_docnos", "out_values"};
    Py_ssize_t k, m, nrest, nval, ndoc, i, j, above, tied, at, room, total, out_at;
    const long long *front, *sizes, *starts, *rest;
    const double *values;
    double kth;
    fb_pair *pairs = NULL;
    unsigned long long *tmp = NULL;
    long long cum;
    PyObject *result = NULL;
    const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOnOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &k,
                          &objs[6], &objs[7]))
        return NULL;
    for (b = 0; b < 8; b++) {
        if (!get_buffer(objs[b], &bufs[b], flags | (b >= 6 ? PyBUF_WRITABLE : 0), "frontier_best", names[b]))
            goto done;
        have[b] = 1;
        kinds[b] = buffer_kind(&bufs[b], "frontier_best", names[b]);
        if (kinds[b] == 0)
            goto done;
    }
    if (kinds[0] != 'f' || kinds[7] != 'f') {
        PyErr_SetString(PyExc_TypeError, "frontier_best: values and out_values must be float64");
        goto done;
    }
    for (b = 1; b <= 5; b += (b == 3 ? 2 : 1)) {  /* front, sizes, starts, rest: int64 */
        if (kinds[b] != 'i' || bufs[b].itemsize != 8) {
            PyErr_Format(PyExc_TypeError, "frontier_best: %s must be int64", names[b]);
            goto done;
        }
    }
    if (kinds[4] == 'f' || kinds[6] != kinds[4] || bufs[6].itemsize != bufs[4].itemsize) {
        PyErr_SetString(PyExc_TypeError, "frontier_best: docnos and out_docnos must be integers of one dtype");
        goto done;
    }
    values = (const double *)bufs[0].buf;
    front = (const long long *)bufs[1].buf;
    sizes = (const long long *)bufs[2].buf;
    starts = (const long long *)bufs[3].buf;
    rest = (const long long *)bufs[5].buf;
    nval = bufs[0].shape[0];
    m = bufs[1].shape[0];
    nrest = bufs[5].shape[0];
    ndoc = bufs[4].shape[0];
    if (bufs[2].shape[0] != m || bufs[3].shape[0] != m) {
        PyErr_SetString(PyExc_ValueError, "frontier_best: one size and one start per frontier pair");
        goto done;
    }
    if (k <= 0 || bufs[6].shape[0] < k || bufs[7].shape[0] < k) {
        PyErr_SetString(PyExc_ValueError, "frontier_best: k must be positive and the outputs hold k");
        goto done;
    }
    for (i = 0; i < m; i++) {
        if (front[i] < 0 || front[i] >= nval || sizes[i] < 0 || starts[i] < 0 || starts[i] > ndoc - sizes[i]) {
            PyErr_SetString(PyExc_ValueError, "frontier_best: a frontier pair is beyond the values or the docnos");
            goto done;
        }
    }
    for (i = 0; i < nrest; i++) {
        if (rest[i] < 0 || rest[i] >= nval) {
            PyErr_SetString(PyExc_ValueError, "frontier_best: a pair code is beyond the values");
            goto done;
        }
    }
    pairs = (fb_pair *)PyMem_Malloc((size_t)(m ? m : 1) * sizeof(fb_pair));
    if (pairs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < m; i++) {
        pairs[i].v = values[front[i]];
        pairs[i].i = i;
    }
    qsort(pairs, (size_t)m, sizeof(fb_pair), fb_pair_cmp);
    cum = 0;
    for (j = 0; j < m; j++) {
        cum += sizes[pairs[j].i];
        if (cum >= k)
            break;
    }
    if (j == m) {  /* fewer than k postings on the frontier */
        result = PyLong_FromLong(-1);
        goto done;
    }
    kth = pairs[j].v;
    for (i = 0; i < nrest; i++) {
        if (values[rest[i]] >= kth) {  /* a pair off the frontier may reach the k best */
            result = PyLong_FromLong(-1);
            goto done;
        }
    }
    above = j;
    while (above > 0 && pairs[above - 1].v == kth)
        above--;
    tied = j + 1;
    while (tied < m && pairs[tied].v == kth)
        tied++;
    room = k;
    for (i = 0; i < above; i++)
        room -= (Py_ssize_t)sizes[pairs[i].i];  /* stays positive: those hold fewer than k */
    total = 0;  /* the largest group of equal-valued pairs, as taken */
    for (i = 0; i < tied; i = at) {
        Py_ssize_t n = 0;
        for (at = i; at < tied && pairs[at].v == pairs[i].v; at++) {
            Py_ssize_t s = (Py_ssize_t)sizes[pairs[at].i];
            n += at >= above && s > room ? room : s;
        }
        if (at - i > 1 && n > total)
            total = n;
    }
    tmp = (unsigned long long *)PyMem_Malloc((size_t)(total ? total : 1) * sizeof(unsigned long long));
    if (tmp == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    out_at = 0;
    /* groups of equal-valued pairs in value order: one pair's docnos are in order already;
     * the docnos of several are sorted together; the tied group gives only its `room` lowest */
    for (i = 0; i < tied; i = at) {
        Py_ssize_t n = 0, want, g;
        for (at = i; at < tied && pairs[at].v == pairs[i].v; at++)
            ;
        want = i >= above ? room : k;  /* pairs above kth are taken whole */
        if (at - i == 1) {
            Py_ssize_t p = pairs[i].i, s = (Py_ssize_t)sizes[p];
            if (s > want)
                s = want;
            for (g = 0; g < s; g++) {
                fb_write(&bufs[6], out_at, fb_read(&bufs[4], kinds[4], (Py_ssize_t)starts[p] + g));
                ((double *)bufs[7].buf)[out_at++] = pairs[i].v;
            }
            continue;
        }
        for (g = i; g < at; g++) {
            Py_ssize_t p = pairs[g].i, s = (Py_ssize_t)sizes[p], e;
            if (g >= above && s > room)
                s = room;
            for (e = 0; e < s; e++)
                tmp[n++] = fb_read(&bufs[4], kinds[4], (Py_ssize_t)starts[p] + e);
        }
        qsort(tmp, (size_t)n, sizeof(unsigned long long), fb_docno_cmp);
        if (n > want)
            n = want;
        for (g = 0; g < n; g++) {
            fb_write(&bufs[6], out_at, tmp[g]);
            ((double *)bufs[7].buf)[out_at++] = pairs[i].v;
        }
    }
    if (out_at != k) {
        PyErr_SetString(PyExc_SystemError, "frontier_best: gathered a wrong count");
        goto done;
    }
    result = PyLong_FromSsize_t(k);
done:
    PyMem_Free(pairs);
    PyMem_Free(tmp);
    for (b = 0; b < 8; b++)
        if (have[b])
            PyBuffer_Release(&bufs[b]);
    return result;
}

/* best_runs(runs, k, out_docnos, out_values) -> int
 * engramdb/index/bm25.py's _Term.best over its runs in one call: the k best (docno, value)
 * entries of the posting runs `runs`, a sequence of (docnos, codes, values) tuples: docnos
 * of any integer width, values float64, and codes None (values[i] is posting i's value) or
 * integers of any width (values[codes[i]]). Best is value descending, then docno ascending:
 * the order of numpy's top_k (bm25.py), a strict total order on (value, docno), so the same
 * entries in the same order whatever the input order; comparisons only, no arithmetic on
 * values (finite: BM25 parts). Writes n = min(k, postings) entries into out_docnos (int64)
 * and out_values (float64) and returns n. A bounded heap: O(postings log k), and a posting
 * worse than the k-th best so far costs one comparison. */
typedef struct { double v; long long d; } br_item;

static int
br_better(const br_item *a, const br_item *b)
{
    return a->v > b->v || (a->v == b->v && a->d < b->d);
}

static int
br_cmp(const void *a, const void *b)
{
    const br_item *x = (const br_item *)a, *y = (const br_item *)b;
    return br_better(x, y) ? -1 : (br_better(y, x) ? 1 : 0);
}

/* the heap keeps its worst entry at the root */
static void
br_down(br_item *h, Py_ssize_t n, Py_ssize_t i)
{
    for (;;) {
        Py_ssize_t w = i, l = 2 * i + 1, r = l + 1;
        br_item t;
        if (l < n && br_better(&h[w], &h[l]))
            w = l;
        if (r < n && br_better(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void
br_up(br_item *h, Py_ssize_t i)
{
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        br_item t;
        if (!br_better(&h[p], &h[i]))
            return;
        t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

static PyObject *
best_runs(PyObject *self, PyObject *args)
{
    PyObject *runs_obj, *od_obj, *ov_obj, *seq = NULL, *result = NULL;
    Py_buffer odb = {0}, ovb = {0};
    int have_od = 0, have_ov = 0;
    Py_ssize_t k, nruns, r, total = 0, cap, n = 0, i;
    br_item *heap = NULL;
    const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnOO", &runs_obj, &k, &od_obj, &ov_obj))
        return NULL;
    if (!get_buffer(od_obj, &odb, flags | PyBUF_WRITABLE, "best_runs", "out_docnos"))
        goto done;
    have_od = 1;
    if (!get_buffer(ov_obj, &ovb, flags | PyBUF_WRITABLE, "best_runs", "out_values"))
        goto done;
    have_ov = 1;
    {
        int dk = buffer_kind(&odb, "best_runs", "out_docnos"), vk;
        if (dk == 0)
            goto done;
        vk = buffer_kind(&ovb, "best_runs", "out_values");
        if (vk == 0)
            goto done;
        if (dk != 'i' || odb.itemsize != 8 || vk != 'f') {
            PyErr_SetString(PyExc_TypeError, "best_runs: out_docnos must be int64 and out_values float64");
            goto done;
        }
    }
    if (k < 0) {
        PyErr_SetString(PyExc_ValueError, "best_runs: k must not be negative");
        goto done;
    }
    seq = PySequence_Fast(runs_obj, "best_runs: runs must be a sequence");
    if (seq == NULL)
        goto done;
    nruns = PySequence_Fast_GET_SIZE(seq);
    for (r = 0; r < nruns; r++) {  /* sizes first: the heap holds min(k, postings) */
        PyObject *item = PySequence_Fast_GET_ITEM(seq, r), *d;
        Py_ssize_t len;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "best_runs: a run is a (docnos, codes, values) tuple");
            goto done;
        }
        d = PyTuple_GET_ITEM(item, 0);
        len = PyObject_Length(d);
        if (len < 0)
            goto done;
        total += len;
    }
    cap = k < total ? k : total;
    if (odb.shape[0] < cap || ovb.shape[0] < cap) {
        PyErr_SetString(PyExc_ValueError, "best_runs: the outputs must hold min(k, postings) entries");
        goto done;
    }
    heap = (br_item *)PyMem_Malloc((size_t)(cap ? cap : 1) * sizeof(br_item));
    if (heap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (r = 0; r < nruns && cap > 0; r++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, r), *code_obj = PyTuple_GET_ITEM(item, 1);
        Py_buffer db = {0}, cb = {0}, vb = {0};
        int have_d = 0, have_c = 0, have_v = 0, dk, ck = 0, ok = 0;
        Py_ssize_t len, nval;
        const double *values;
        if (!get_buffer(PyTuple_GET_ITEM(item, 0), &db, flags, "best_runs", "docnos"))
            goto run_done;
        have_d = 1;
        if (!get_buffer(PyTuple_GET_ITEM(item, 2), &vb, flags, "best_runs", "values"))
            goto run_done;
        have_v = 1;
        if (code_obj != Py_None) {
            if (!get_buffer(code_obj, &cb, flags, "best_runs", "codes"))
                goto run_done;
            have_c = 1;
        }
        dk = buffer_kind(&db, "best_runs", "docnos");
        if (dk == 0)
            goto run_done;
        if (buffer_kind(&vb, "best_runs", "values") != 'f') {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "best_runs: values must be float64");
            goto run_done;
        }
        if (have_c && (ck = buffer_kind(&cb, "best_runs", "codes")) == 0)
            goto run_done;
        if (dk == 'f' || ck == 'f') {
            PyErr_SetString(PyExc_TypeError, "best_runs: docnos and codes must be integer arrays");
            goto run_done;
        }
        len = db.shape[0];
        nval = vb.shape[0];
        if (have_c ? cb.shape[0] != len : nval != len) {
            PyErr_SetString(PyExc_ValueError, have_c ? "best_runs: one code per docno" : "best_runs: one value per docno");
            goto run_done;
        }
        values = (const double *)vb.buf;
        for (i = 0; i < len; i++) {
            br_item x;
            if (have_c) {
                unsigned long long c = fb_read(&cb, ck, i);
                if (c >= (unsigned long long)nval) {  /* a negative code reads as a huge one */
                    PyErr_SetString(PyExc_ValueError, "best_runs: a code is beyond the values");
                    goto run_done;
                }
                x.v = values[c];
            } else {
                x.v = values[i];
            }
            if (n == cap && x.v < heap[0].v)
                continue;  /* worse than the k-th best so far */
            x.d = (long long)fb_read(&db, dk, i);
            if (n < cap) {
                heap[n] = x;
                br_up(heap, n++);
            } else if (br_better(&x, &heap[0])) {
                heap[0] = x;
                br_down(heap, n, 0);
            }
        }
        ok = 1;
    run_done:
        if (have_d) PyBuffer_Release(&db);
        if (have_c) PyBuffer_Release(&cb);
        if (have_v) PyBuffer_Release(&vb);
        if (!ok)
            goto done;
    }
    qsort(heap, (size_t)n, sizeof(br_item), br_cmp);
    for (i = 0; i < n; i++) {
        ((long long *)odb.buf)[i] = heap[i].d;
        ((double *)ovb.buf)[i] = heap[i].v;
    }
    result = PyLong_FromSsize_t(n);
done:
    PyMem_Free(heap);
    Py_XDECREF(seq);
    if (have_od) PyBuffer_Release(&odb);
    if (have_ov) PyBuffer_Release(&ovb);
    return result;
}

/* concat_postings(parts, out_docnos, out_tf, out_dl) -> bool
 * engramdb/index/bm25.py's _delta: the columns of posting blocks (docnos int64, tf float64,
 * dl float64, one length each), one block after another, copied into the three outputs
 * (of the blocks' total length): three numpy concatenates cost ~4 µs each on the CPU a
 * commit leaves cold. Returns whether every block's first docno is above the previous
 * block's last (then the docnos, increasing within each block, increase throughout; else
 * the caller sorts). */
static PyObject *
concat_postings(PyObject *self, PyObject *args)
{
    PyObject *parts_obj, *outs[3], *seq = NULL, *result = NULL;
    Py_buffer ob[3];
    int have_o[3] = {0, 0, 0}, o, increasing = 1, started = 0;
    static const char *onames[3] = {"out_docnos", "out_tf", "out_dl"};
    static const char *names[3] = {"docnos", "tf", "dl"};
    Py_ssize_t nparts, p, total = 0, at = 0;
    long long last = 0;
    const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOO", &parts_obj, &outs[0], &outs[1], &outs[2]))
        return NULL;
    for (o = 0; o < 3; o++) {
        int kind;
        if (!get_buffer(outs[o], &ob[o], flags | PyBUF_WRITABLE, "concat_postings", onames[o]))
            goto done;
        have_o[o] = 1;
        kind = buffer_kind(&ob[o], "concat_postings", onames[o]);
        if (kind == 0)
            goto done;
        if (o == 0 ? (kind != 'i' || ob[o].itemsize != 8) : kind != 'f') {
            PyErr_SetString(PyExc_TypeError, "concat_postings: out_docnos must be int64, out_tf and out_dl float64");
            goto done;
        }
    }
    if (ob[1].shape[0] != ob[0].shape[0] || ob[2].shape[0] != ob[0].shape[0]) {
        PyErr_SetString(PyExc_ValueError, "concat_postings: the outputs must be of one length");
        goto done;
    }
    seq = PySequence_Fast(parts_obj, "concat_postings: parts must be a sequence");
    if (seq == NULL)
        goto done;
    nparts = PySequence_Fast_GET_SIZE(seq);
    for (p = 0; p < nparts; p++) {  /* lengths first: nothing is written unless all fit */
        PyObject *item = PySequence_Fast_GET_ITEM(seq, p);
        Py_ssize_t len;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "concat_postings: a part is a (docnos, tf, dl) tuple");
            goto done;
        }
        len = PyObject_Length(PyTuple_GET_ITEM(item, 0));
        if (len < 0)
            goto done;
        total += len;
    }
    if (total != ob[0].shape[0]) {
        PyErr_SetString(PyExc_ValueError, "concat_postings: the outputs must hold the parts' postings exactly");
        goto done;
    }
    for (p = 0; p < nparts; p++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, p);
        Py_buffer b[3];
        int have[3] = {0, 0, 0}, ok = 1, c;
        Py_ssize_t len = 0;
        for (c = 0; c < 3 && ok; c++) {
            int kind;
            if (!get_buffer(PyTuple_GET_ITEM(item, c), &b[c], flags, "concat_postings", names[c])) {
                ok = 0;
                break;
            }
            have[c] = 1;
            kind = buffer_kind(&b[c], "concat_postings", names[c]);
            if (kind == 0) {
                ok = 0;
            } else if (c == 0 ? (kind != 'i' || b[c].itemsize != 8) : kind != 'f') {
                PyErr_SetString(PyExc_TypeError, "concat_postings: docnos must be int64, tf and dl float64");
                ok = 0;
            } else if (c == 0) {
                len = b[0].shape[0];
            } else if (b[c].shape[0] != len) {
                PyErr_SetString(PyExc_ValueError, "concat_postings: a part's columns must be of one length");
                ok = 0;
            }
        }
        if (ok && at + len > total) {  /* an exporter changed size since: refuse */
            PyErr_SetString(PyExc_ValueError, "concat_postings: the parts changed size");
            ok = 0;
        }
        if (ok && len > 0) {
            const long long *d = (const long long *)b[0].buf;
            if (started && d[0] <= last)
                increasing = 0;
            started = 1;
            last = d[len - 1];
            memcpy((long long *)ob[0].buf + at, d, (size_t)len * sizeof(long long));
            memcpy((double *)ob[1].buf + at, b[1].buf, (size_t)len * sizeof(double));
            memcpy((double *)ob[2].buf + at, b[2].buf, (size_t)len * sizeof(double));
            at += len;
        }
        for (c = 0; c < 3; c++)
            if (have[c])
                PyBuffer_Release(&b[c]);
        if (!ok)
            goto done;
    }
    if (at != total) {
        PyErr_SetString(PyExc_ValueError, "concat_postings: the parts changed size");
        goto done;
    }
    result = PyBool_FromLong(increasing);
done:
    Py_XDECREF(seq);
    for (o = 0; o < 3; o++)
        if (have_o[o])
            PyBuffer_Release(&ob[o]);
    return result;
}

/* Read an increasing tuple of segment numbers into a C array (PyMem); -1 with an exception
 * set when it is not a tuple of ints. */
static Py_ssize_t
segno_array(PyObject *obj, const char *what, long long **out)
{
    Py_ssize_t n, i;
    long long *a;
    if (!PyTuple_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "term_holders: %s must be a tuple of ints", what);
        return -1;
    }
    n = PyTuple_GET_SIZE(obj);
    a = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(long long));
    if (a == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        a[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, i));
        if (a[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(a);
            return -1;
        }
    }
    *out = a;
    return n;
}

/* term_holders(blind, small, old_live, old_holders, dead_sizes) -> (holders, counts)
 * engramdb/index/bm25.py's SegmentedBM25._holders and _counts in one call: `small` is a read
 * state's small segments, a list of (segno, term set or None) by increasing segno; a small
 * segment holds the term when it is one of `old_holders` (the cached entry's delta holders,
 * increasing), or when it is not in `old_live` (the entry's live segments, increasing: a
 * segment there that was no holder never becomes one, term sets being immutable) and its
 * term set is None (not known: it may) or holds `blind` (Python's `in`). Returns the
 * holders (a tuple of ints, increasing) and their tombstone counts (dead_sizes.get(s, 0)).
 * On the CPU a commit leaves cold, the Python path's set difference, list comprehensions,
 * sort and tuple cost ~10 µs per query term; this walks the three increasing lists once. */
static PyObject *
term_holders(PyObject *self, PyObject *args)
{
    PyObject *blind, *small, *live_obj, *held_obj, *dead_sizes, *seq = NULL, *holders = NULL, *counts = NULL;
    PyObject *result = NULL;
    long long *live = NULL, *held = NULL;
    Py_ssize_t nlive, nheld, nsmall, i, il = 0, ih = 0, n = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOO", &blind, &small, &live_obj, &held_obj, &dead_sizes))
        return NULL;
    if (!PyDict_Check(dead_sizes)) {
        PyErr_SetString(PyExc_TypeError, "term_holders: dead_sizes must be a dict");
        return NULL;
    }
    if ((nlive = segno_array(live_obj, "old_live", &live)) < 0)
        goto done;
    if ((nheld = segno_array(held_obj, "old_holders", &held)) < 0)
        goto done;
    seq = PySequence_Fast(small, "term_holders: small must be a sequence");
    if (seq == NULL)
        goto done;
    nsmall = PySequence_Fast_GET_SIZE(seq);
    holders = PyTuple_New(nsmall);  /* at most every small segment; shrunk below */
    if (holders == NULL)
        goto done;
    for (i = 0; i < nsmall; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *segobj, *terms;
        long long s;
        int take;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "term_holders: small holds (segno, terms) tuples");
            goto done;
        }
        segobj = PyTuple_GET_ITEM(item, 0);
        terms = PyTuple_GET_ITEM(item, 1);
        s = PyLong_AsLongLong(segobj);
        if (s == -1 && PyErr_Occurred())
            goto done;
        while (ih < nheld && held[ih] < s)
            ih++;
        while (il < nlive && live[il] < s)
            il++;
        if (ih < nheld && held[ih] == s) {
            take = 1;
        } else if (il < nlive && live[il] == s) {
            take = 0;
        } else if (terms == Py_None) {
            take = 1;
        } else {
            take = PySequence_Contains(terms, blind);
            if (take < 0)
                goto done;
        }
        if (take) {
            Py_INCREF(segobj);
            PyTuple_SET_ITEM(holders, n, segobj);
            n++;
        }
    }
    if (n < nsmall) {
        PyObject *cut = PyTuple_GetSlice(holders, 0, n);  /* the slots past n are NULL: XDECREF'd */
        if (cut == NULL)
            goto done;
        Py_SETREF(holders, cut);
    }
    counts = PyTuple_New(n);
    if (counts == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        PyObject *c = PyDict_GetItemWithError(dead_sizes, PyTuple_GET_ITEM(holders, i));
        if (c == NULL) {
            if (PyErr_Occurred())
                goto done;
            c = PyLong_FromLong(0);
            if (c == NULL)
                goto done;
        } else {
            Py_INCREF(c);
        }
        PyTuple_SET_ITEM(counts, i, c);
    }
    result = PyTuple_Pack(2, holders, counts);
done:
    PyMem_Free(live);
    PyMem_Free(held);
    Py_XDECREF(seq);
    Py_XDECREF(holders);
    Py_XDECREF(counts);
    return result;
}

/* NumPy's ufunc call information (numpy.ufunc._resolve_dtypes_and_context and
 * _get_strided_loop, NumPy >= 1.24: a capsule named "numpy_1.24_ufunc_call_info"; the
 * layout is the one NumPy documents for that name). Only the strided loop's signature is
 * used: loop(context, data, dimensions, strides, auxdata) -> 0 on success. */
typedef int (*np_strided_loop)(void *context, char *const *data, const Py_ssize_t *dimensions,
                               const Py_ssize_t *strides, void *auxdata);
typedef struct {
    np_strided_loop strided_loop;
    void *context;
    void *auxdata;
    unsigned char requires_pyapi;
    unsigned char no_floatingpoint_errors;
} np_ufunc_call_info;
#define NP_CALL_INFO_NAME "numpy_1.24_ufunc_call_info"

/* numpy.log1p's float64 loop from `capsule` (bm25.py's _log1p_loop), or NULL with an error */
static np_ufunc_call_info *
log1p_loop(PyObject *capsule, const char *who)
{
    np_ufunc_call_info *info = (np_ufunc_call_info *)PyCapsule_GetPointer(capsule, NP_CALL_INFO_NAME);
    if (info != NULL && (info->strided_loop == NULL || info->requires_pyapi)) {
        PyErr_Format(PyExc_ValueError, "%s: call_info holds no GIL-free strided loop "
                                       "(call numpy.ufunc._get_strided_loop first)", who);
        return NULL;
    }
    return info;
}

/* the idf argument (n_docs - df + 0.5) / (df + 0.5), with Python's float operations */
static double
idf_argument(long long n_docs, double df)
{
    double x = (double)n_docs - df;
    x = x + 0.5;
    return x / (df + 0.5);
}

/* ln(1 + xs[i]) into xs[n + i] for i < n by `info`'s loop, the floating-point status flags
 * kept as they were; 0, or -1 with an error */
static int
run_log1p(np_ufunc_call_info *info, double *xs, Py_ssize_t n, const char *who)
{
    Py_ssize_t strides[2] = {sizeof(double), sizeof(double)};
    char *data[2];
    fexcept_t saved;
    int rc;
    if (n == 0)
        return 0;
    data[0] = (char *)xs;
    data[1] = (char *)(xs + n);
    fegetexceptflag(&saved, FE_ALL_EXCEPT);
    rc = info->strided_loop(info->context, data, &n, strides, info->auxdata);
    fesetexceptflag(&saved, FE_ALL_EXCEPT);
    if (rc < 0) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "%s: numpy's log1p loop failed", who);
        return -1;
    }
    return 0;
}

/* idf_values(call_info, n_docs, dfs) -> list[float]
 * engramdb/index/bm25.py's _idfs: per df of `dfs` (ints), the argument
 * (n_docs - df + 0.5) / (df + 0.5) with Python's float operations (n_docs and df converted
 * to double first, as float(df) and int - float do; no fused multiply-add), then ln(1 + x)
 * by NumPy's own float64 log1p loop, which `call_info` (numpy.log1p's, for float64 -> float64,
 * contiguous strides) gives: the same loop np.log1p runs over a contiguous array, so the
 * same bits (numpy's SIMD log1p differs from libm's in the last bit for some inputs, so
 * C's log1p would not do). On the CPU a commit leaves cold, numpy's ufunc dispatch around
 * that loop costs ~20 µs per query; this calls the loop alone. The floating-point status
 * flags are restored after the loop (numpy clears them before its own loops anyway). */
static PyObject *
idf_values(PyObject *self, PyObject *args)
{
    PyObject *capsule, *dfs_obj, *seq = NULL, *result = NULL;
    long long n_docs;
    np_ufunc_call_info *info;
    Py_ssize_t n, i;
    double *xs = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "OLO", &capsule, &n_docs, &dfs_obj))
        return NULL;
    info = log1p_loop(capsule, "idf_values");
    if (info == NULL)
        return NULL;
    seq = PySequence_Fast(dfs_obj, "idf_values: dfs must be a sequence");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    xs = PyMem_Malloc((size_t)(2 * n + 1) * sizeof(double));
    if (xs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        double df = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (df == -1.0 && PyErr_Occurred())
            goto done;
        xs[i] = idf_argument(n_docs, df);
    }
    if (run_log1p(info, xs, n, "idf_values") < 0)
        goto done;
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        PyObject *v = PyFloat_FromDouble(xs[n + i]);
        if (v == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, v);
    }
done:
    PyMem_Free(xs);
    Py_XDECREF(seq);
    return result;
}

/* term_values(call_info, n_docs, avgdl, k1, b, specs, empty) -> list[(base, delta)]
 * engramdb/index/bm25.py's _Term.of for the terms whose values a state lacks: per spec
 * (df, w, pair_tf, pair_dl, delta_tf, delta_dl) the term's idf (idf_values' operations and
 * numpy's own log1p loop: the same bits) and then pair_values' operations over the base
 * run's pairs (pair_tf, pair_dl; None: no base) and over the delta's postings (delta_tf,
 * delta_dl; None: no delta), all written into one float64 array from `empty(total)`
 * (numpy.empty), returned as a slice of it per part (None for a missing part). After a
 * commit every query term's values are new (N and avgdl moved); on the CPU a commit leaves
 * cold the Python around idf_values and pair_values (argument lists, the output, the
 * split) cost ~10 µs a query. */
static PyObject *
term_values(PyObject *self, PyObject *args)
{
    PyObject *capsule, *specs_obj, *empty, *seq = NULL, *out_obj = NULL, *result = NULL;
    long long n_docs;
    double avgdl, k1, b, shift;
    np_ufunc_call_info *info;
    Py_ssize_t n, i, total = 0, at = 0;
    double *xs = NULL, *out;
    Py_buffer ob = {0};
    int have_o = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OLdddOO", &capsule, &n_docs, &avgdl, &k1, &b, &specs_obj, &empty))
        return NULL;
    info = log1p_loop(capsule, "term_values");
    if (info == NULL)
        return NULL;
    seq = PySequence_Fast(specs_obj, "term_values: specs must be a sequence");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    xs = PyMem_Malloc((size_t)(2 * n + 1) * sizeof(double));
    if (xs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {  /* check every spec and size the output first */
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        double df;
        int c;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 6) {
            PyErr_SetString(PyExc_TypeError, "term_values: a spec is a (df, w, pair_tf, pair_dl, delta_tf, delta_dl) tuple");
            goto done;
        }
        df = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 0));
        if (df == -1.0 && PyErr_Occurred())
            goto done;
        xs[i] = idf_argument(n_docs, df);
        for (c = 2; c < 6; c += 2) {
            PyObject *tf = PyTuple_GET_ITEM(item, c);
            Py_ssize_t len;
            if (tf == Py_None)
                continue;
            len = PyObject_Length(tf);
            if (len < 0)
                goto done;
            total += len;
        }
    }
    if (run_log1p(info, xs, n, "term_values") < 0)
        goto done;
    out_obj = PyObject_CallFunction(empty, "n", total);
    if (out_obj == NULL)
        goto done;
    if (!get_buffer(out_obj, &ob, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE, "term_values", "empty(n)"))
        goto done;
    have_o = 1;
    if (buffer_kind(&ob, "term_values", "empty(n)") != 'f' || ob.shape[0] != total) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "term_values: empty(n) must give n float64");
        goto done;
    }
    out = (double *)ob.buf;
    shift = 1.0 - b;
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *parts[2] = {Py_None, Py_None}, *pair;
        double idf = xs[n + i], w = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 1));
        int c;
        if (w == -1.0 && PyErr_Occurred())
            goto fail;
        for (c = 0; c < 2; c++) {
            PyObject *tfo = PyTuple_GET_ITEM(item, 2 + 2 * c), *dlo = PyTuple_GET_ITEM(item, 3 + 2 * c);
            Py_buffer tb = {0}, db = {0};
            const double *tf, *dl;
            Py_ssize_t len, j;
            int ok;
            if (tfo == Py_None)
                continue;
            if (!get_buffer(tfo, &tb, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS, "term_values", "tf"))
                goto part_fail;
            if (!get_buffer(dlo, &db, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS, "term_values", "dl")) {
                PyBuffer_Release(&tb);
                goto part_fail;
            }
            ok = buffer_kind(&tb, "term_values", "tf") == 'f' && buffer_kind(&db, "term_values", "dl") == 'f'
                 && tb.shape[0] == db.shape[0] && tb.shape[0] <= total - at;
            if (!ok) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "term_values: tf and dl must be float64 arrays of one length");
                PyBuffer_Release(&tb);
                PyBuffer_Release(&db);
                goto part_fail;
            }
            len = tb.shape[0];
            tf = (const double *)tb.buf;
            dl = (const double *)db.buf;
            for (j = 0; j < len; j++) {  /* pair_values' operations, in its order */
                double x = dl[j] * b;
                x = x / avgdl;
                x = x + shift;
                x = x * k1;
                x = x + tf[j];
                x = tf[j] / x;
                x = x * idf;
                if (w != 1.0)
                    x = x * w;
                out[at + j] = x;
            }
            PyBuffer_Release(&tb);
            PyBuffer_Release(&db);
            parts[c] = PySequence_GetSlice(out_obj, at, at + len);
            if (parts[c] == NULL) {
                parts[c] = Py_None;
                goto part_fail;
            }
            at += len;
        }
        if (parts[0] == Py_None)
            Py_INCREF(Py_None);
        if (parts[1] == Py_None)
            Py_INCREF(Py_None);
        pair = PyTuple_Pack(2, parts[0], parts[1]);
        Py_DECREF(parts[0]);
        Py_DECREF(parts[1]);
        if (pair == NULL)
            goto fail;
        PyList_SET_ITEM(result, i, pair);
        continue;
    part_fail:
        for (c = 0; c < 2; c++)
            if (parts[c] != Py_None)
                Py_DECREF(parts[c]);
        goto fail;
    }
    if (at != total) {
        PyErr_SetString(PyExc_ValueError, "term_values: the specs changed size");
        goto fail;
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    if (have_o) PyBuffer_Release(&ob);
    Py_XDECREF(out_obj);
    PyMem_Free(xs);
    Py_XDECREF(seq);
    return result;
}

/* fresh_delta(blind, docnos, tf, dl, fresh, empty, int64) -> (docnos, tf, dl, sizes, increasing)
 * engramdb/index/bm25.py's SegmentedBM25._delta when a term's delta only gains segments this
 * handle wrote (its _Fresh columns) and none of them has tombstones: the old delta's
 * columns (docnos int64, tf and dl float64) followed by the term's postings in each of
 * `fresh` (objects with `rows`, a dict blind -> (start, end), and `docnos`, `tf`, `dl`
 * columns of those dtypes), in order. `sizes` is a tuple of each fresh segment's posting
 * count for the term (0 when it has none); `increasing` whether every part's first docno is
 * above the previous part's last (else the caller sorts). One part alone is returned as
 * it is (a slice of its columns, as _Fresh.block gives it); more are copied into arrays
 * from `empty(n, int64)` and `empty(n)` (numpy.empty). On the CPU a commit leaves cold, the
 * Python of the per-segment blocks and the concatenation cost ~10 µs per delta. */
static PyObject *
fresh_delta(PyObject *self, PyObject *args)
{
    static PyObject *s_rows = NULL, *s_docnos = NULL, *s_tf = NULL, *s_dl = NULL;
    PyObject *blind, *old[3], *fresh_obj, *empty, *int64, *seq = NULL, *sizes = NULL, *result = NULL;
    PyObject *cols[3] = {NULL, NULL, NULL}, *outs[3] = {NULL, NULL, NULL};
    PyObject *parts[64][3];
    Py_ssize_t spans[64][2], nparts = 0, nfresh, f, total = 0, i;
    Py_buffer ob[3];
    int have_o[3] = {0, 0, 0}, c, increasing = 1, started = 0;
    long long last = 0;
    const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &blind, &old[0], &old[1], &old[2], &fresh_obj, &empty, &int64))
        return NULL;
    if (s_rows == NULL) {
        s_rows = PyUnicode_InternFromString("rows");
        s_docnos = PyUnicode_InternFromString("docnos");
        s_tf = PyUnicode_InternFromString("tf");
        s_dl = PyUnicode_InternFromString("dl");
        if (!s_rows || !s_docnos || !s_tf || !s_dl)
            return NULL;
    }
    seq = PySequence_Fast(fresh_obj, "fresh_delta: fresh must be a sequence");
    if (seq == NULL)
        return NULL;
    nfresh = PySequence_Fast_GET_SIZE(seq);
    if (nfresh + 1 > 64) {
        PyErr_SetString(PyExc_ValueError, "fresh_delta: at most 63 fresh segments");
        goto done;
    }
    sizes = PyTuple_New(nfresh);
    if (sizes == NULL)
        goto done;
    /* the parts (borrowed columns) and their spans: the old delta's whole columns first */
    i = PyObject_Length(old[0]);
    if (i < 0)
        goto done;
    if (i > 0) {
        for (c = 0; c < 3; c++)
            parts[nparts][c] = old[c];
        spans[nparts][0] = 0;
        spans[nparts][1] = i;
        nparts++;
        total += i;
    }
    for (f = 0; f < nfresh; f++) {
        PyObject *fr = PySequence_Fast_GET_ITEM(seq, f), *rows, *at, *size;
        Py_ssize_t a = 0, b = 0;
        rows = PyObject_GetAttr(fr, s_rows);
        if (rows == NULL)
            goto done;
        if (!PyDict_Check(rows)) {
            Py_DECREF(rows);
            PyErr_SetString(PyExc_TypeError, "fresh_delta: a fresh segment's rows must be a dict");
            goto done;
        }
        at = PyDict_GetItemWithError(rows, blind);  /* borrowed; the tuple lives while rows does */
        if (at == NULL && PyErr_Occurred()) {
            Py_DECREF(rows);
            goto done;
        }
        if (at != NULL) {
            if (!PyTuple_Check(at) || PyTuple_GET_SIZE(at) != 2) {
                Py_DECREF(rows);
                PyErr_SetString(PyExc_TypeError, "fresh_delta: a row is a (start, end) tuple");
                goto done;
            }
            a = PyLong_AsSsize_t(PyTuple_GET_ITEM(at, 0));
            b = PyLong_AsSsize_t(PyTuple_GET_ITEM(at, 1));
            if ((a == -1 || b == -1) && PyErr_Occurred()) {
                Py_DECREF(rows);
                goto done;
            }
            if (a < 0 || b < a) {
                Py_DECREF(rows);
                PyErr_SetString(PyExc_ValueError, "fresh_delta: a row's span is not 0 <= start <= end");
                goto done;
            }
        }
        Py_DECREF(rows);
        size = PyLong_FromSsize_t(b - a);
        if (size == NULL)
            goto done;
        PyTuple_SET_ITEM(sizes, f, size);
        if (b > a) {
            for (c = 0; c < 3; c++)
                parts[nparts][c] = fr;  /* its columns are fetched below */
            spans[nparts][0] = a;
            spans[nparts][1] = b;
            nparts++;
            total += b - a;
        }
    }
    if (nparts == 1 && parts[0][0] != old[0]) {  /* one fresh block alone: its slices */
        PyObject *fr = parts[0][0];
        PyObject *names[3] = {s_docnos, s_tf, s_dl};
        for (c = 0; c < 3; c++) {
            PyObject *col = PyObject_GetAttr(fr, names[c]);
            if (col == NULL)
                goto done;
            outs[c] = PySequence_GetSlice(col, spans[0][0], spans[0][1]);
            Py_DECREF(col);
            if (outs[c] == NULL)
                goto done;
        }
        if (PyObject_Length(outs[0]) != total || PyObject_Length(outs[1]) != total
                || PyObject_Length(outs[2]) != total) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "fresh_delta: a row's span is past the columns");
            goto done;
        }
        result = Py_BuildValue("(OOOOO)", outs[0], outs[1], outs[2], sizes, Py_True);
        goto done;
    }
    if (nparts == 1) {  /* the old delta alone */
        result = Py_BuildValue("(OOOOO)", old[0], old[1], old[2], sizes, Py_True);
        goto done;
    }
    outs[0] = PyObject_CallFunction(empty, "nO", total, int64);
    outs[1] = outs[0] ? PyObject_CallFunction(empty, "n", total) : NULL;
    outs[2] = outs[1] ? PyObject_CallFunction(empty, "n", total) : NULL;
    if (outs[2] == NULL)
        goto done;
    for (c = 0; c < 3; c++) {
        int kind;
        if (!get_buffer(outs[c], &ob[c], flags | PyBUF_WRITABLE, "fresh_delta", "empty(n)"))
            goto done;
        have_o[c] = 1;
        kind = buffer_kind(&ob[c], "fresh_delta", "empty(n)");
        if (kind == 0)
            goto done;
        if ((c == 0 ? (kind != 'i' || ob[c].itemsize != 8) : kind != 'f') || ob[c].shape[0] != total) {
            PyErr_SetString(PyExc_TypeError, "fresh_delta: empty(n, int64) and empty(n) must give n int64 and n float64");
            goto done;
        }
    }
    {
        Py_ssize_t p, to = 0;
        for (p = 0; p < nparts; p++) {
            Py_buffer b[3];
            int have[3] = {0, 0, 0}, ok = 1;
            Py_ssize_t a = spans[p][0], e = spans[p][1];
            PyObject *names[3] = {s_docnos, s_tf, s_dl};
            for (c = 0; c < 3 && ok; c++) {
                int kind;
                if (parts[p][c] == old[c]) {
                    cols[c] = old[c];
                    Py_INCREF(cols[c]);
                } else {
                    cols[c] = PyObject_GetAttr(parts[p][c], names[c]);
                    if (cols[c] == NULL) {
                        ok = 0;
                        break;
                    }
                }
                if (!get_buffer(cols[c], &b[c], flags, "fresh_delta", "a column")) {
                    ok = 0;
                    break;
                }
                have[c] = 1;
                kind = buffer_kind(&b[c], "fresh_delta", "a column");
                if (kind == 0) {
                    ok = 0;
                } else if (c == 0 ? (kind != 'i' || b[c].itemsize != 8) : kind != 'f') {
                    PyErr_SetString(PyExc_TypeError, "fresh_delta: docnos must be int64, tf and dl float64");
                    ok = 0;
                } else if (b[c].shape[0] < e || to + (e - a) > total) {
                    PyErr_SetString(PyExc_ValueError, "fresh_delta: a span is past its columns");
                    ok = 0;
                }
            }
            if (ok && e > a) {
                const long long *dn = (const long long *)b[0].buf + a;
                if (started && dn[0] <= last)
                    increasing = 0;
                started = 1;
                last = dn[e - a - 1];
                memcpy((long long *)ob[0].buf + to, dn, (size_t)(e - a) * sizeof(long long));
                memcpy((double *)ob[1].buf + to, (const double *)b[1].buf + a, (size_t)(e - a) * sizeof(double));
                memcpy((double *)ob[2].buf + to, (const double *)b[2].buf + a, (size_t)(e - a) * sizeof(double));
                to += e - a;
            }
            for (c = 0; c < 3; c++) {
                if (have[c])
                    PyBuffer_Release(&b[c]);
                Py_CLEAR(cols[c]);
            }
            if (!ok)
                goto done;
        }
        if (to != total) {
            PyErr_SetString(PyExc_ValueError, "fresh_delta: the parts changed size");
            goto done;
        }
    }
    result = Py_BuildValue("(OOOOO)", outs[0], outs[1], outs[2], sizes, increasing ? Py_True : Py_False);
done:
    for (c = 0; c < 3; c++) {
        if (have_o[c])
            PyBuffer_Release(&ob[c]);
        Py_XDECREF(outs[c]);
        Py_XDECREF(cols[c]);
    }
    Py_XDECREF(sizes);
    Py_XDECREF(seq);
    return result;
}

/* top_terms(acc, terms, longest, best, k, empty, uint64) -> (docnos, scores)
 * engramdb/index/bm25.py's SegmentedBM25.top for two or more terms, after their runs are at
 * hand, in one call: on the CPU a commit leaves cold, its ~20 numpy calls (the candidates'
 * concatenate, the adds, gather and reset, the floor, argpartition, lexsort and dedupe)
 * cost ~40 µs a query, and ~25 warm.
 *
 * terms: per query term, in the summation order, its runs (a sequence of (docnos, codes,
 * values) tuples as best_runs takes: docnos of any integer width, distinct within a term,
 * increasing within a run; codes None or integers; values float64). acc: a float64
 * accumulator, zero, longer than every candidate docno. longest: the index of the term
 * that is looked up rather than added (-1: none), best: that term's k best docnos (any
 * integer width; None when longest is -1).
 *
 * The candidates are every docno of the terms' runs but the looked-up term's, then best.
 * Terms are added in order: acc[docno] += value for each posting of a run, and for the
 * looked-up term, per run, each candidate found in the run (binary search) gets
 * acc[c] = acc[c] + value once, however often it is a candidate (numpy's fancy-indexed add:
 * gather, add, scatter). So each document's score is the same float64 additions in the same
 * order as top()'s numpy path. The result: the k best distinct candidates, score descending
 * then docno ascending (a strict total order on (score, docno)): what top()'s floor,
 * argpartition, lexsort and dedupe select (they only drop entries that cannot be among
 * them), as new arrays empty(n, uint64) and empty(n), n = min(k, distinct candidates).
 * A candidate's slot is set to -1.0 once read (scores are sums of positive BM25 parts), so
 * a repeated candidate is taken once; every candidate's slot is zero again on return, on
 * error too (every slot an add touched is a candidate's). */
typedef struct {
    Py_buffer d, c, v;
    int have_d, have_c, have_v, dk, ck;
    Py_ssize_t n, nval;
    Py_ssize_t term;
} tt_run;

static void
tt_release(tt_run *runs, Py_ssize_t nruns)
{
    Py_ssize_t r;
    for (r = 0; r < nruns; r++) {
        if (runs[r].have_d) PyBuffer_Release(&runs[r].d);
        if (runs[r].have_c) PyBuffer_Release(&runs[r].c);
        if (runs[r].have_v) PyBuffer_Release(&runs[r].v);
    }
}

/* the position of x in the increasing docnos of run, or -1 */
static Py_ssize_t
tt_find(const tt_run *run, unsigned long long x)
{
    Py_ssize_t lo = 0, hi = run->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (fb_read(&run->d, run->dk, mid) < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < run->n && fb_read(&run->d, run->dk, lo) == x ? lo : -1;
}

static PyObject *
top_terms(PyObject *self, PyObject *args)
{
    PyObject *acc_obj, *terms_obj, *best_obj, *empty, *uint64, *seq = NULL, *result = NULL;
    PyObject *outs[2] = {NULL, NULL};
    Py_buffer ab = {0}, bb = {0}, ob[2];
    int have_a = 0, have_b = 0, have_o[2] = {0, 0}, bk = 0, failed = 0;
    Py_ssize_t longest, k, nterms, nruns = 0, t, r, i, j, ncand = 0, nacc, cap, n = 0;
    tt_run *runs = NULL;
    unsigned long long *cand = NULL;
    double *tmp = NULL, *acc;
    br_item *heap = NULL;
    const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOnOnOO", &acc_obj, &terms_obj, &longest, &best_obj, &k, &empty, &uint64))
        return NULL;
    if (!get_buffer(acc_obj, &ab, flags | PyBUF_WRITABLE, "top_terms", "acc"))
        goto done;
    have_a = 1;
    if (buffer_kind(&ab, "top_terms", "acc") != 'f') {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "top_terms: acc must be float64");
        goto done;
    }
    nacc = ab.shape[0];
    acc = (double *)ab.buf;
    if (k <= 0) {
        PyErr_SetString(PyExc_ValueError, "top_terms: k must be positive");
        goto done;
    }
    seq = PySequence_Fast(terms_obj, "top_terms: terms must be a sequence");
    if (seq == NULL)
        goto done;
    nterms = PySequence_Fast_GET_SIZE(seq);
    if (longest < -1 || longest >= nterms || (longest >= 0) != (best_obj != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "top_terms: longest must be -1 (best None) or a term's index (best its docnos)");
        goto done;
    }
    for (t = 0; t < nterms; t++) {
        PyObject *runs_of = PySequence_Fast_GET_ITEM(seq, t);
        Py_ssize_t len = PySequence_Check(runs_of) ? PySequence_Length(runs_of) : -1;
        if (len < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "top_terms: a term's runs must be a sequence");
            goto done;
        }
        nruns += len;
    }
    runs = (tt_run *)PyMem_Calloc((size_t)(nruns ? nruns : 1), sizeof(tt_run));
    if (runs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    r = 0;
    for (t = 0; t < nterms; t++) {
        PyObject *tseq = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, t), "top_terms: a term's runs must be a sequence");
        Py_ssize_t m;
        if (tseq == NULL)
            goto done;
        m = PySequence_Fast_GET_SIZE(tseq);
        for (i = 0; i < m && r < nruns; i++, r++) {
            PyObject *item = PySequence_Fast_GET_ITEM(tseq, i), *code_obj;
            tt_run *run = &runs[r];
            run->term = t;
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
                PyErr_SetString(PyExc_TypeError, "top_terms: a run is a (docnos, codes, values) tuple");
                break;
            }
            code_obj = PyTuple_GET_ITEM(item, 1);
            if (!get_buffer(PyTuple_GET_ITEM(item, 0), &run->d, flags, "top_terms", "docnos"))
                break;
            run->have_d = 1;
            if (!get_buffer(PyTuple_GET_ITEM(item, 2), &run->v, flags, "top_terms", "values"))
                break;
            run->have_v = 1;
            if (code_obj != Py_None) {
                if (!get_buffer(code_obj, &run->c, flags, "top_terms", "codes"))
                    break;
                run->have_c = 1;
            }
            if ((run->dk = buffer_kind(&run->d, "top_terms", "docnos")) == 0)
                break;
            if (buffer_kind(&run->v, "top_terms", "values") != 'f') {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "top_terms: values must be float64");
                break;
            }
            if (run->have_c && (run->ck = buffer_kind(&run->c, "top_terms", "codes")) == 0)
                break;
            if (run->dk == 'f' || run->ck == 'f') {
                PyErr_SetString(PyExc_TypeError, "top_terms: docnos and codes must be integer arrays");
                break;
            }
            run->n = run->d.shape[0];
            run->nval = run->v.shape[0];
            if (run->have_c ? run->c.shape[0] != run->n : run->nval != run->n) {
                PyErr_SetString(PyExc_ValueError, run->have_c ? "top_terms: one code per docno" : "top_terms: one value per docno");
                break;
            }
            if (t != longest)
                ncand += run->n;
        }
        Py_DECREF(tseq);
        if (PyErr_Occurred())
            goto done;
        if (i < m) {
            PyErr_SetString(PyExc_ValueError, "top_terms: the terms changed size");
            goto done;
        }
    }
    if (r != nruns) {
        PyErr_SetString(PyExc_ValueError, "top_terms: the terms changed size");
        goto done;
    }
    if (best_obj != Py_None) {
        if (!get_buffer(best_obj, &bb, flags, "top_terms", "best"))
            goto done;
        have_b = 1;
        if ((bk = buffer_kind(&bb, "top_terms", "best")) == 0)
            goto done;
        if (bk == 'f') {
            PyErr_SetString(PyExc_TypeError, "top_terms: best must be an integer array");
            goto done;
        }
        ncand += bb.shape[0];
    }
    /* everything that can fail is allocated and checked before acc is touched */
    cand = (unsigned long long *)PyMem_Malloc((size_t)(ncand ? ncand : 1) * sizeof(unsigned long long));
    tmp = (double *)PyMem_Malloc((size_t)(ncand ? ncand : 1) * sizeof(double));
    cap = k < ncand ? k : ncand;
    heap = (br_item *)PyMem_Malloc((size_t)(cap ? cap : 1) * sizeof(br_item));
    if (cand == NULL || tmp == NULL || heap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    j = 0;
    for (r = 0; r <= nruns; r++) {
        const Py_buffer *b = r < nruns ? &runs[r].d : &bb;
        int kind = r < nruns ? runs[r].dk : bk;
        Py_ssize_t len;
        if (r < nruns ? runs[r].term == longest : !have_b)
            continue;
        len = b->shape[0];
        for (i = 0; i < len; i++) {
            unsigned long long x = fb_read(b, kind, i);
            /* a negative docno reads as a huge one */
            if (x >= (unsigned long long)nacc) {
                PyErr_SetString(PyExc_ValueError, "top_terms: a docno is beyond the accumulator");
                goto done;
            }
            cand[j++] = x;
        }
    }
    for (r = 0; r < nruns && !failed; r++) {
        tt_run *run = &runs[r];
        const double *values = (const double *)run->v.buf;
        if (run->term != longest) {
            for (i = 0; i < run->n; i++) {
                unsigned long long c = run->have_c ? fb_read(&run->c, run->ck, i) : (unsigned long long)i;
                if (c >= (unsigned long long)run->nval) {
                    failed = 1;
                    break;
                }
                acc[fb_read(&run->d, run->dk, i)] += values[c];
            }
        } else {
            /* numpy's acc[cand[hit]] += values[...]: all reads before the writes */
            for (j = 0; j < ncand; j++) {
                Py_ssize_t at = tt_find(run, cand[j]);
                unsigned long long c;
                tmp[j] = -1.0;  /* no hit (scores are never negative) */
                if (at < 0)
                    continue;
                c = run->have_c ? fb_read(&run->c, run->ck, at) : (unsigned long long)at;
                if (c >= (unsigned long long)run->nval) {
                    failed = 1;
                    break;
                }
                tmp[j] = acc[cand[j]] + values[c];
            }
            for (j = 0; j < ncand && !failed; j++)
                if (tmp[j] >= 0.0)
                    acc[cand[j]] = tmp[j];
        }
    }
    if (!failed) {
        for (j = 0; j < ncand; j++) {
            br_item x;
            x.v = acc[cand[j]];
            if (x.v < 0.0)
                continue;  /* taken already */
            acc[cand[j]] = -1.0;
            x.d = (long long)cand[j];
            if (n < cap) {
                heap[n] = x;
                br_up(heap, n++);
            } else if (br_better(&x, &heap[0])) {
                heap[0] = x;
                br_down(heap, n, 0);
            }
        }
    }
    for (j = 0; j < ncand; j++)
        acc[cand[j]] = 0.0;
    if (failed) {
        PyErr_SetString(PyExc_ValueError, "top_terms: a code is beyond the values");
        goto done;
    }
    qsort(heap, (size_t)n, sizeof(br_item), br_cmp);
    outs[0] = PyObject_CallFunction(empty, "nO", n, uint64);
    outs[1] = outs[0] ? PyObject_CallFunction(empty, "n", n) : NULL;
    if (outs[1] == NULL)
        goto done;
    for (i = 0; i < 2; i++) {
        int kind;
        if (!get_buffer(outs[i], &ob[i], flags | PyBUF_WRITABLE, "top_terms", "empty(n)"))
            goto done;
        have_o[i] = 1;
        kind = buffer_kind(&ob[i], "top_terms", "empty(n)");
        if (kind == 0)
            goto done;
        if ((i == 0 ? kind != 'u' : kind != 'f') || ob[i].itemsize != 8 || ob[i].shape[0] != n) {
            PyErr_SetString(PyExc_TypeError, "top_terms: empty(n, uint64) and empty(n) must give n uint64 and n float64");
            goto done;
        }
    }
    for (i = 0; i < n; i++) {
        ((unsigned long long *)ob[0].buf)[i] = (unsigned long long)heap[i].d;
        ((double *)ob[1].buf)[i] = heap[i].v;
    }
    result = PyTuple_Pack(2, outs[0], outs[1]);
done:
    for (i = 0; i < 2; i++) {
        if (have_o[i])
            PyBuffer_Release(&ob[i]);
        Py_XDECREF(outs[i]);
    }
    if (runs != NULL) {
        tt_release(runs, nruns);
        PyMem_Free(runs);
    }
    if (have_b) PyBuffer_Release(&bb);
    if (have_a) PyBuffer_Release(&ab);
    PyMem_Free(cand);
    PyMem_Free(tmp);
    PyMem_Free(heap);
    Py_XDECREF(seq);
    return result;
}

/* query_top(found, n_docs, total_len, cached, call_info, k1, b, ratio, k, acc, grow, best_of,
 *           empty, uint64) -> (docnos uint64, scores)
 * engramdb/index/bm25.py's _Term.of and the rest of SegmentedBM25.top for two or more terms,
 * in one call: `found` holds the query's (postings, w) in summation order (_TermPostings
 * objects and float weights). Per term its values under the state (n_docs, total_len):
 * postings.memo[(n_docs, total_len, w)] when `cached` holds them, else computed by
 * term_values (the same operations, the same bits) and, when `cached`, memoised as _Term.of
 * does ((base values or base.docnos, delta values or delta.tf, {}); a memo of 4 states is
 * cleared first). Then top()'s steps: the longest term (the first of the largest size),
 * looked up instead of scanned when its size > ratio * the others' (its best k docnos:
 * best_of(postings, w, memo, k), bm25's _Term.best), the accumulator (acc, or grow(size)
 * when acc is None or shorter than the largest docno + 1) and top_terms. Memos are only
 * ever stored whole and right, and top_terms leaves acc zero on any error: a failure leaves
 * the caches as consistent as before. On the CPU a commit leaves cold, the Python of
 * _Term.of and top()'s tail (~25 function calls for 4 terms) is what this replaces. */
static PyObject *
query_top(PyObject *self, PyObject *args)
{
    static PyObject *s_memo = NULL, *s_base = NULL, *s_delta = NULL, *s_docnos = NULL, *s_codes = NULL, *s_pairs = NULL,
                    *s_tf = NULL, *s_dl = NULL;
    PyObject *found, *n_docs_obj, *total_obj, *capsule, *acc, *grow, *best_of, *empty, *uint64;
    PyObject *seq = NULL, *key = NULL, *specs = NULL, *values = NULL, *runs = NULL, *best = Py_None, *result = NULL;
    PyObject **memos = NULL, **bases = NULL, **deltas = NULL, **bdocs = NULL, **ddocs = NULL, **postings = NULL;
    Py_ssize_t *sizes = NULL, *bsz = NULL, *dsz = NULL;
    long long n_docs, total_len;
    unsigned long long max_docno = 0;
    int cached, any_docno = 0;
    double k1, b, ratio, avgdl;
    Py_ssize_t k, n, i, longest = 0, total = 0, nmiss = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO!O!pOdddnOOOOO", &found, &PyLong_Type, &n_docs_obj, &PyLong_Type, &total_obj, &cached,
                          &capsule, &k1, &b, &ratio, &k, &acc, &grow, &best_of, &empty, &uint64))
        return NULL;
    if (s_memo == NULL) {
        s_memo = PyUnicode_InternFromString("memo");
        s_base = PyUnicode_InternFromString("base");
        s_delta = PyUnicode_InternFromString("delta");
        s_docnos = PyUnicode_InternFromString("docnos");
        s_codes = PyUnicode_InternFromString("codes");
        s_pairs = PyUnicode_InternFromString("pairs");
        s_tf = PyUnicode_InternFromString("tf");
        s_dl = PyUnicode_InternFromString("dl");
        if (!s_memo || !s_base || !s_delta || !s_docnos || !s_codes || !s_pairs || !s_tf || !s_dl)
            return NULL;
    }
    n_docs = PyLong_AsLongLong(n_docs_obj);
    total_len = n_docs == -1 && PyErr_Occurred() ? -1 : PyLong_AsLongLong(total_obj);
    if (PyErr_Occurred())
        return NULL;
    if (n_docs <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "query_top: n_docs and k must be positive");
        return NULL;
    }
    avgdl = (double)total_len / (double)n_docs;  /* Python's int / int: exact operands below 2**53 */
    seq = PySequence_Fast(found, "query_top: found must be a sequence");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n < 2) {
        PyErr_SetString(PyExc_ValueError, "query_top: found must hold two or more terms");
        goto done;
    }
    memos = (PyObject **)PyMem_Calloc((size_t)n * 6, sizeof(PyObject *));
    sizes = (Py_ssize_t *)PyMem_Calloc((size_t)n * 3, sizeof(Py_ssize_t));
    if (memos == NULL || sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    bases = memos + n;
    deltas = memos + 2 * n;
    bdocs = memos + 3 * n;
    ddocs = memos + 4 * n;
    postings = memos + 5 * n;
    bsz = sizes + n;
    dsz = sizes + 2 * n;
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *p, *w;
        int s;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyFloat_Check(PyTuple_GET_ITEM(item, 1))) {
            PyErr_SetString(PyExc_TypeError, "query_top: found holds (postings, float weight) tuples");
            goto done;
        }
        p = PyTuple_GET_ITEM(item, 0);
        w = PyTuple_GET_ITEM(item, 1);
        Py_INCREF(p);
        postings[i] = p;
        if ((bases[i] = PyObject_GetAttr(p, s_base)) == NULL || (deltas[i] = PyObject_GetAttr(p, s_delta)) == NULL
            || (bdocs[i] = PyObject_GetAttr(bases[i], s_docnos)) == NULL
            || (ddocs[i] = PyObject_GetAttr(deltas[i], s_docnos)) == NULL)
            goto done;
        if ((bsz[i] = PyObject_Length(bdocs[i])) < 0 || (dsz[i] = PyObject_Length(ddocs[i])) < 0)
            goto done;
        sizes[i] = bsz[i] + dsz[i];
        if (sizes[i] == 0) {
            PyErr_SetString(PyExc_ValueError, "query_top: a term without postings");
            goto done;
        }
        if (sizes[i] > sizes[longest])
            longest = i;
        total += sizes[i];
        for (s = 0; s < 2; s++) {  /* the largest docno: each run's last (docnos increase) */
            PyObject *docs = s == 0 ? bdocs[i] : ddocs[i];
            Py_buffer db = {0};
            int kind;
            if ((s == 0 ? bsz[i] : dsz[i]) == 0)
                continue;
            if (!get_buffer(docs, &db, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS, "query_top", "docnos"))
                goto done;
            kind = buffer_kind(&db, "query_top", "docnos");
            if (kind == 0 || kind == 'f' || db.shape[0] == 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "query_top: docnos must be an integer array");
                PyBuffer_Release(&db);
                goto done;
            }
            {
                unsigned long long last = fb_read(&db, kind, db.shape[0] - 1);
                if (kind == 'i' && (long long)last < 0) {
                    PyErr_SetString(PyExc_ValueError, "query_top: a negative docno");
                    PyBuffer_Release(&db);
                    goto done;
                }
                if (!any_docno || last > max_docno)
                    max_docno = last;
                any_docno = 1;
            }
            PyBuffer_Release(&db);
        }
        if (cached) {
            PyObject *memo_dict = PyObject_GetAttr(p, s_memo);
            if (memo_dict == NULL)
                goto done;
            if (!PyDict_Check(memo_dict)) {
                Py_DECREF(memo_dict);
                PyErr_SetString(PyExc_TypeError, "query_top: postings.memo must be a dict");
                goto done;
            }
            key = PyTuple_Pack(3, n_docs_obj, total_obj, w);
            if (key == NULL) {
                Py_DECREF(memo_dict);
                goto done;
            }
            memos[i] = PyDict_GetItemWithError(memo_dict, key);
            Py_XINCREF(memos[i]);
            Py_CLEAR(key);
            Py_DECREF(memo_dict);
            if (memos[i] == NULL && PyErr_Occurred())
                goto done;
            if (memos[i] != NULL && (!PyTuple_Check(memos[i]) || PyTuple_GET_SIZE(memos[i]) != 3)) {
                PyErr_SetString(PyExc_TypeError, "query_top: a memo is a (base, delta, best) tuple");
                goto done;
            }
        }
        if (memos[i] == NULL)
            nmiss++;
    }
    if (nmiss) {
        /* the missing values in one term_values call, as _Term.of makes it */
        PyObject *tv_args;
        Py_ssize_t at = 0;
        specs = PyList_New(nmiss);
        if (specs == NULL)
            goto done;
        for (i = 0; i < n; i++) {
            PyObject *spec, *pairs = NULL, *ptf = NULL, *pdl = NULL, *dtf = NULL, *ddl = NULL;
            if (memos[i] != NULL)
                continue;
            if ((pairs = PyObject_GetAttr(postings[i], s_pairs)) == NULL
                || (pdl = PyObject_GetAttr(pairs, s_dl)) == NULL
                || (ddl = PyObject_GetAttr(deltas[i], s_dl)) == NULL
                || (bsz[i] && (ptf = PyObject_GetAttr(pairs, s_tf)) == NULL)
                || (dsz[i] && (dtf = PyObject_GetAttr(deltas[i], s_tf)) == NULL)) {
                Py_XDECREF(pairs);
                Py_XDECREF(pdl);
                Py_XDECREF(ddl);
                Py_XDECREF(ptf);
                goto done;
            }
            spec = Py_BuildValue("(nOOOOO)", sizes[i], PyTuple_GET_ITEM(PySequence_Fast_GET_ITEM(seq, i), 1),
                                 ptf ? ptf : Py_None, pdl, dtf ? dtf : Py_None, ddl);
            Py_DECREF(pairs);
            Py_DECREF(pdl);
            Py_DECREF(ddl);
            Py_XDECREF(ptf);
            Py_XDECREF(dtf);
            if (spec == NULL)
                goto done;
            PyList_SET_ITEM(specs, at++, spec);
        }
        tv_args = Py_BuildValue("(OLdddOO)", capsule, n_docs, avgdl, k1, b, specs, empty);
        if (tv_args == NULL)
            goto done;
        values = term_values(NULL, tv_args);
        Py_DECREF(tv_args);
        if (values == NULL)
            goto done;
        at = 0;
        for (i = 0; i < n; i++) {
            PyObject *pair, *vb, *vd, *best_memo, *memo;
            if (memos[i] != NULL)
                continue;
            pair = PyList_GET_ITEM(values, at++);
            vb = PyTuple_GET_ITEM(pair, 0);
            vd = PyTuple_GET_ITEM(pair, 1);
            if (vd == Py_None) {
                vd = PyObject_GetAttr(deltas[i], s_tf);
                if (vd == NULL)
                    goto done;
            } else {
                Py_INCREF(vd);
            }
            best_memo = PyDict_New();
            if (best_memo == NULL) {
                Py_DECREF(vd);
                goto done;
            }
            memo = PyTuple_Pack(3, vb == Py_None ? bdocs[i] : vb, vd, best_memo);
            Py_DECREF(vd);
            Py_DECREF(best_memo);
            if (memo == NULL)
                goto done;
            memos[i] = memo;
            if (cached) {
                PyObject *memo_dict = PyObject_GetAttr(postings[i], s_memo);
                int rc;
                if (memo_dict == NULL)
                    goto done;
                key = PyTuple_Pack(3, n_docs_obj, total_obj, PyTuple_GET_ITEM(PySequence_Fast_GET_ITEM(seq, i), 1));
                rc = key == NULL ? -1 : 0;
                if (rc == 0 && PyDict_Size(memo_dict) >= 4)
                    PyDict_Clear(memo_dict);
                if (rc == 0)
                    rc = PyDict_SetItem(memo_dict, key, memo);
                Py_CLEAR(key);
                Py_DECREF(memo_dict);
                if (rc < 0)
                    goto done;
            }
        }
    }
    /* top(): lookup or scan, the accumulator, top_terms */
    {
        PyObject *tt_args, *lookup_w;
        int lookup = (double)sizes[longest] > ratio * (double)(total - sizes[longest]);
        if (lookup) {
            lookup_w = PyTuple_GET_ITEM(PySequence_Fast_GET_ITEM(seq, longest), 1);
            best = PyObject_CallFunction(best_of, "OOOn", postings[longest], lookup_w, memos[longest], k);
            if (best == NULL)
                goto done;
        }
        runs = PyList_New(n);
        if (runs == NULL)
            goto done;
        for (i = 0; i < n; i++) {
            PyObject *term_runs = PyList_New(0), *run;
            int rc = 0;
            if (term_runs == NULL)
                goto done;
            PyList_SET_ITEM(runs, i, term_runs);
            if (bsz[i]) {
                PyObject *codes = PyObject_GetAttr(bases[i], s_codes);
                if (codes == NULL)
                    goto done;
                run = PyTuple_Pack(3, bdocs[i], codes, PyTuple_GET_ITEM(memos[i], 0));
                Py_DECREF(codes);
                rc = run == NULL ? -1 : PyList_Append(term_runs, run);
                Py_XDECREF(run);
            }
            if (rc == 0 && dsz[i]) {
                run = PyTuple_Pack(3, ddocs[i], Py_None, PyTuple_GET_ITEM(memos[i], 1));
                rc = run == NULL ? -1 : PyList_Append(term_runs, run);
                Py_XDECREF(run);
            }
            if (rc < 0)
                goto done;
        }
        if (acc == Py_None || PyObject_Length(acc) <= (Py_ssize_t)max_docno) {
            if (PyErr_Occurred())
                goto done;
            acc = PyObject_CallFunction(grow, "n", (Py_ssize_t)max_docno + 1);
            if (acc == NULL)
                goto done;
        } else {
            Py_INCREF(acc);
        }
        tt_args = Py_BuildValue("(OOnOnOO)", acc, runs, lookup ? longest : (Py_ssize_t)-1, best, k, empty, uint64);
        Py_DECREF(acc);
        if (tt_args == NULL)
            goto done;
        result = top_terms(NULL, tt_args);
        Py_DECREF(tt_args);
    }
done:
    if (memos != NULL) {
        for (i = 0; i < 6 * n; i++)
            Py_XDECREF(memos[i]);
        PyMem_Free(memos);
    }
    PyMem_Free(sizes);
    if (best != Py_None)
        Py_XDECREF(best);  /* NULL when best_of raised */
    Py_XDECREF(key);
    Py_XDECREF(specs);
    Py_XDECREF(values);
    Py_XDECREF(runs);
    Py_XDECREF(seq);
    return result;
}

/* query_found(terms, weights, check, blinds, blind, cache_get, serial, term_postings, txn, d)
 *   -> list[(postings, w)]
 * engramdb/index/bm25.py's SegmentedBM25._found over a read state with documents: per term
 * of `terms` (sorted: the summation order) its weight as a float (an int or float that is
 * positive and finite as it is; anything else goes to check(term, w), bm25's _check_weight,
 * which raises or converts), its blinded key (blinds[term], else blind(term)), and its
 * postings: the cache's entry (cache_get(("t", blind))) when it was found to cover this
 * state (entry.seen == serial), else term_postings(txn, d, blind) (which catches it up);
 * terms without postings are left out. The same answers as _found, minus the Python a term
 * whose entry is marked right needs (~5 functions per term). A catch-up in here too (the
 * entry proving right after a commit, _term_postings' term_holders checks) was measured
 * and dropped: no gain after a commit (its checks ran twice for the terms the new memory
 * holds), ~90 lines of _term_postings' logic twice. */
static PyObject *
query_found(PyObject *self, PyObject *args)
{
    static PyObject *s_t = NULL, *s_seen = NULL, *s_base = NULL, *s_delta = NULL, *s_docnos = NULL;
    PyObject *terms, *weights, *check, *blinds, *blind_fn, *cache_get, *term_postings, *txn, *d;
    PyObject *seq = NULL, *result = NULL;
    long long serial;
    Py_ssize_t n, i;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO!OO!OOLOOO", &terms, &PyDict_Type, &weights, &check, &PyDict_Type, &blinds,
                          &blind_fn, &cache_get, &serial, &term_postings, &txn, &d))
        return NULL;
    if (s_t == NULL) {
        s_t = PyUnicode_InternFromString("t");
        s_seen = PyUnicode_InternFromString("seen");
        s_base = PyUnicode_InternFromString("base");
        s_delta = PyUnicode_InternFromString("delta");
        s_docnos = PyUnicode_InternFromString("docnos");
        if (!s_t || !s_seen || !s_base || !s_delta || !s_docnos)
            return NULL;
    }
    seq = PySequence_Fast(terms, "query_found: terms must be a sequence");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    result = PyList_New(0);
    if (result == NULL)
        goto fail;
    for (i = 0; i < n; i++) {
        PyObject *term = PySequence_Fast_GET_ITEM(seq, i), *w_obj, *w = NULL, *bl, *key, *entry = NULL, *pair;
        Py_ssize_t size = 0;
        int s, rc;
        w_obj = PyDict_GetItemWithError(weights, term);
        if (w_obj == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, term);
            goto fail;
        }
        if (PyFloat_CheckExact(w_obj) || PyLong_CheckExact(w_obj)) {
            double v = PyFloat_CheckExact(w_obj) ? PyFloat_AS_DOUBLE(w_obj) : PyLong_AsDouble(w_obj);
            if (v == -1.0 && PyErr_Occurred())
                PyErr_Clear();  /* too large for a float: check() says so */
            else if (v > 0.0 && isfinite(v))
                w = PyFloat_CheckExact(w_obj) ? (Py_INCREF(w_obj), w_obj) : PyFloat_FromDouble(v);
        }
        if (w == NULL && !PyErr_Occurred())
            w = PyObject_CallFunctionObjArgs(check, term, w_obj, NULL);
        if (w == NULL)
            goto fail;
        bl = PyDict_GetItemWithError(blinds, term);
        if (bl != NULL)
            Py_INCREF(bl);
        else if (!PyErr_Occurred())
            bl = PyObject_CallOneArg(blind_fn, term);
        if (bl == NULL) {
            Py_DECREF(w);
            goto fail;
        }
        key = PyTuple_Pack(2, s_t, bl);
        if (key != NULL) {
            entry = PyObject_CallOneArg(cache_get, key);
            Py_DECREF(key);
        }
        if (entry != NULL && entry != Py_None) {
            PyObject *seen = PyObject_GetAttr(entry, s_seen);
            long long got = seen == NULL ? -1 : PyLong_AsLongLong(seen);
            Py_XDECREF(seen);
            if (got == -1 && PyErr_Occurred())
                Py_CLEAR(entry);
            else if (got != serial) {
                Py_DECREF(entry);
                Py_INCREF(Py_None);
                entry = Py_None;
            }
        }
        if (entry == Py_None) {
            Py_DECREF(entry);
            entry = PyObject_CallFunctionObjArgs(term_postings, txn, d, bl, NULL);
        }
        Py_DECREF(bl);
        if (entry == NULL) {
            Py_DECREF(w);
            goto fail;
        }
        for (s = 0; s < 2; s++) {  /* postings.size */
            PyObject *part = PyObject_GetAttr(entry, s == 0 ? s_base : s_delta), *docs;
            Py_ssize_t len;
            docs = part == NULL ? NULL : PyObject_GetAttr(part, s_docnos);
            Py_XDECREF(part);
            len = docs == NULL ? -1 : PyObject_Length(docs);
            Py_XDECREF(docs);
            if (len < 0) {
                Py_DECREF(entry);
                Py_DECREF(w);
                goto fail;
            }
            size += len;
        }
        if (size == 0) {
            Py_DECREF(entry);
            Py_DECREF(w);
            continue;
        }
        pair = PyTuple_Pack(2, entry, w);
        Py_DECREF(entry);
        Py_DECREF(w);
        rc = pair == NULL ? -1 : PyList_Append(result, pair);
        Py_XDECREF(pair);
        if (rc < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return result;
fail:
    Py_XDECREF(result);
    Py_DECREF(seq);
    return NULL;
}
