/*
 * What the provider's C tests share: CHECK counts a failure and says where
 * and why, and the test goes on; DIE ends the test at once (a setup step
 * that later checks cannot do without).
 */
#ifndef XRC_OFI_CHECK_H
#define XRC_OFI_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int failures;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            failures++;                                                        \
        }                                                                      \
    } while (0)

#define DIE(...)                                                               \
    do {                                                                       \
        fprintf(stderr, __VA_ARGS__);                                          \
        fprintf(stderr, "\n");                                                 \
        exit(1);                                                               \
    } while (0)

#endif
