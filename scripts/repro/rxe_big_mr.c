/*
 * rxe_big_mr: rdma_rxe refuses a legal memory registration, with a kernel
 * WARNING. Plain libibverbs, no xrcbtl; ready to send upstream.
 *
 *   rxe_big_mr DEVICE
 *
 * The device reports max_mr_size 2^64 - 1, but Linux 6.12's rxe (seen on
 * Debian 12's 6.12.117+deb12-amd64) keeps one 16-byte entry per page of a
 * region in a single kcalloc'ed array (rxe_mr.c, __alloc_mr_page_info). Past
 * 4 MiB of entries, 262,144 pages or 1 GiB, the page allocator warns
 * (WARNING at mm/page_alloc.c in __alloc_pages_noprof, from
 * rxe_mr_init_user) and ibv_reg_mr fails with ENOMEM.
 *
 * This program registers a page-aligned region of exactly 262,144 pages,
 * which must succeed, and one of 262,145 pages, which the device's caps
 * allow as well. Prints what each did, with errno. Exits 0 if both
 * registered (the bug is gone), 1 if the larger one failed (the bug; the
 * kernel log then shows the warning), 2 on bad arguments, a missing device
 * or any other failure. It touches the memory first, so the guest needs
 * a little over 2 GiB free.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAGE 4096UL
#define PAGES (1UL << 18) /* 262,144: 4 MiB of 16-byte entries */

/* Registers `pages` pages of fresh, touched memory; returns 0 or errno. */
static int try_register(struct ibv_pd *pd, unsigned long pages)
{
	size_t len = pages * PAGE;
	void *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return -1;
	memset(buf, 1, len);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	int err = mr ? 0 : errno;
	printf("rxe_big_mr: %lu pages (%zu bytes): %s\n", pages, len, mr ? "registered" : strerror(err));
	if (mr)
		ibv_dereg_mr(mr);
	munmap(buf, len);
	return err;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: rxe_big_mr DEVICE\n");
		return 2;
	}
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && i < n && !ctx; i++)
		if (strcmp(ibv_get_device_name(list[i]), argv[1]) == 0)
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "rxe_big_mr: no device %s\n", argv[1]);
		return 2;
	}
	struct ibv_device_attr attr;
	if (ibv_query_device(ctx, &attr)) {
		perror("ibv_query_device");
		return 2;
	}
	printf("rxe_big_mr: %s reports max_mr_size %#llx\n", argv[1], (unsigned long long)attr.max_mr_size);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd) {
		perror("ibv_alloc_pd");
		return 2;
	}
	int at_limit = try_register(pd, PAGES);
	int past_limit = try_register(pd, PAGES + 1);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	if (at_limit)
		return 2;
	return past_limit ? 1 : 0;
}
