/*
 * Two processes, one endpoint each, through libfabric's API alone: the
 * provider across two nodes (scripts/guest-ofi runs the server on one
 * node and the client on the other). Each writes its endpoint's name into
 * DIR/ROLE.addr and inserts the other's once that file is there.
 *
 *   client: sends every size from 0 B to 4 MiB (each power of two and one
 *           byte either side) tagged to the server, which checks it and
 *           sends it back untagged; the client checks the echo. Then RMA
 *           on the server's window, whose address and key came in a
 *           message: writes and reads of several sizes, each read back
 *           and compared; a write with a key the server never gave
 *           completes in error; a good write after it lands.
 *   server: echoes, then checks the client's last write in its window
 *           once the client says it is done, and says goodbye.
 *
 *   pair server|client DIR
 *
 * Every wait follows a completion or a file appearing, bounded by LIMIT_S,
 * the harness's limit, which only a hung run reaches.
 */
#define _POSIX_C_SOURCE 200809L
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <stdlib.h>

#include "procs.h"

enum { MAX = 4 << 20, WIN = 1 << 20, DONE_TAG = 1u << 20 };

/* The completion of `ctx` (the only operation outstanding): 0, or the
 * error's code (positive) with its entry in *e. Dies past LIMIT_S. */
static int wait_for(void *ctx, struct fi_cq_tagged_entry *c, struct fi_cq_err_entry *e)
{
    for (double end = now_s() + LIMIT_S; now_s() < end;) {
        ssize_t n = fi_cq_read(cq, c, 1);
        if (n == -FI_EAGAIN)
            continue;
        if (n == -FI_EAVAIL) {
            memset(e, 0, sizeof *e);
            if (fi_cq_readerr(cq, e, 0) != 1)
                DIE("pair: fi_cq_readerr");
            CHECK(e->op_context == ctx, "an error for another operation (%p)", e->op_context);
            return e->err ? e->err : -1;
        }
        if (n != 1)
            DIE("pair: fi_cq_read: %s", fi_strerror((int) -n));
        CHECK(c->op_context == ctx, "a completion for another operation (%p)", c->op_context);
        return 0;
    }
    DIE("pair: no completion within %d s (the harness's limit)", LIMIT_S);
}

static void fill(uint8_t *b, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t) (i * 131 + seed * 7 + (i >> 9));
}

static int sizes(size_t *out)
{
    int n = 0;
    out[n++] = 0;
    for (size_t p = 1; p <= MAX; p *= 2) {
        if (p > 1)
            out[n++] = p - 1;
        out[n++] = p;
        if (p < MAX)
            out[n++] = p + 1;
    }
    return n;
}

/* The window's address and key, as the server tells the client. */
struct window {
    uint64_t addr, key;
};

static void server(const char *dir)
{
    static uint8_t buf[MAX], want[MAX];
    struct fi_cq_tagged_entry c;
    struct fi_cq_err_entry e;
    int ctx;
    publish(dir, "server");
    fi_addr_t client = peer(dir, "client");
    uint8_t *win = calloc(1, WIN);
    struct fid_mr *mr = NULL;
    int rc = fi_mr_reg(domain, win, WIN, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL);
    if (rc)
        DIE("pair: server: fi_mr_reg: %s", fi_strerror(-rc));
    struct window w = {(uint64_t) (uintptr_t) win, fi_mr_key(mr)};
    CHECK(fi_send(ep, &w, sizeof w, NULL, client, &ctx) == 0, "fi_send of the window");
    CHECK(wait_for(&ctx, &c, &e) == 0, "the window's message");

    size_t len[80];
    int n = sizes(len);
    for (int i = 0; i < n; i++) {
        CHECK(fi_trecv(ep, buf, len[i], NULL, client, (uint64_t) i, 0, &ctx) == 0, "fi_trecv %zu B", len[i]);
        int r = wait_for(&ctx, &c, &e);
        fill(want, len[i], (unsigned) i);
        CHECK(r == 0 && c.len == len[i] && c.tag == (uint64_t) i && !memcmp(buf, want, len[i]),
              "%zu B tagged from the client: %d, %zu B, tag %llu", len[i], r, c.len, (unsigned long long) c.tag);
        CHECK(fi_send(ep, buf, len[i], NULL, client, &ctx) == 0, "fi_send of the echo");
        CHECK(wait_for(&ctx, &c, &e) == 0, "the echo of %zu B", len[i]);
    }

    /* The client's last write is there once it says it is done. */
    uint8_t word[8];
    CHECK(fi_trecv(ep, word, sizeof word, NULL, client, DONE_TAG, 0, &ctx) == 0, "fi_trecv of done");
    CHECK(wait_for(&ctx, &c, &e) == 0, "the client is done");
    fill(want, 32, 7);
    CHECK(!memcmp(win, want, 32), "the client's last write is in the window");
    CHECK(fi_tsend(ep, word, sizeof word, NULL, client, DONE_TAG, &ctx) == 0, "fi_tsend of goodbye");
    CHECK(wait_for(&ctx, &c, &e) == 0, "goodbye");
    CHECK(fi_close(&mr->fid) == 0, "fi_close(mr)");
    free(win);
    close_all();
    printf("pair: server: %d sizes checked and echoed, the window written\n", n);
}

static void client(const char *dir)
{
    static uint8_t src[MAX], back[MAX];
    struct fi_cq_tagged_entry c;
    struct fi_cq_err_entry e;
    int ctx;
    publish(dir, "client");
    fi_addr_t server = peer(dir, "server");
    struct window w;
    CHECK(fi_recv(ep, &w, sizeof w, NULL, server, &ctx) == 0, "fi_recv of the window");
    CHECK(wait_for(&ctx, &c, &e) == 0 && c.len == sizeof w, "the window's message");

    size_t len[80];
    int n = sizes(len);
    for (int i = 0; i < n; i++) {
        fill(src, len[i], (unsigned) i);
        CHECK(fi_tsend(ep, src, len[i], NULL, server, (uint64_t) i, &ctx) == 0, "fi_tsend %zu B", len[i]);
        CHECK(wait_for(&ctx, &c, &e) == 0, "the send of %zu B", len[i]);
        memset(back, 0, len[i]);
        CHECK(fi_recv(ep, back, len[i], NULL, server, &ctx) == 0, "fi_recv of the echo");
        int r = wait_for(&ctx, &c, &e);
        CHECK(r == 0 && c.len == len[i] && !memcmp(back, src, len[i]), "the echo of %zu B: %d, %zu B", len[i], r,
              c.len);
    }

    /* RMA on the server's window. */
    const size_t rma[] = {1, 8, 4095, 4096, 65537, WIN - 64};
    for (size_t i = 0; i < sizeof rma / sizeof rma[0]; i++) {
        size_t off = (i * 8) % 64;
        fill(src, rma[i], (unsigned) i + 40);
        CHECK(fi_write(ep, src, rma[i], NULL, server, w.addr + off, w.key, &ctx) == 0, "fi_write %zu B", rma[i]);
        CHECK(wait_for(&ctx, &c, &e) == 0, "the write of %zu B", rma[i]);
        memset(back, 0, rma[i]);
        CHECK(fi_read(ep, back, rma[i], NULL, server, w.addr + off, w.key, &ctx) == 0, "fi_read %zu B", rma[i]);
        CHECK(wait_for(&ctx, &c, &e) == 0 && !memcmp(back, src, rma[i]), "%zu B written and read back", rma[i]);
    }
    CHECK(fi_write(ep, src, 64, NULL, server, w.addr, w.key + 1, &ctx) == 0, "fi_write with a wrong key");
    int r = wait_for(&ctx, &c, &e);
    CHECK(r != 0, "a write with a wrong key completes in error");
    if (r)
        printf("pair: client: the wrong key: %s\n", fi_strerror(r));
    fill(src, 32, 7);
    CHECK(fi_write(ep, src, 32, NULL, server, w.addr, w.key, &ctx) == 0, "fi_write after the refusal");
    CHECK(wait_for(&ctx, &c, &e) == 0, "a good write after the refusal");

    uint8_t word[8] = {1};
    CHECK(fi_tsend(ep, word, sizeof word, NULL, server, DONE_TAG, &ctx) == 0, "fi_tsend of done");
    CHECK(wait_for(&ctx, &c, &e) == 0, "done");
    CHECK(fi_trecv(ep, word, sizeof word, NULL, server, DONE_TAG, 0, &ctx) == 0, "fi_trecv of goodbye");
    CHECK(wait_for(&ctx, &c, &e) == 0, "goodbye");
    close_all();
    printf("pair: client: %d sizes each way and %zu RMA sizes checked, the wrong key refused\n", n,
           sizeof rma / sizeof rma[0]);
}

int main(int argc, char **argv)
{
    if (argc != 3)
        DIE("usage: pair server|client DIR");
    open_all(FI_MSG | FI_TAGGED | FI_RMA);
    if (!strcmp(argv[1], "server"))
        server(argv[2]);
    else if (!strcmp(argv[1], "client"))
        client(argv[2]);
    else
        DIE("pair: unknown role %s", argv[1]);
    if (failures) {
        fprintf(stderr, "pair: %s: %d failures\n", argv[1], failures);
        return 1;
    }
    return 0;
}
