/* An LD_PRELOAD shim that shifts a process's wall clock by an offset the test controls (distlock-tests,
 * clock.rs). libfaketime hangs at start-up under redis-server's jemalloc; this shim avoids what makes that
 * hang: it never calls dlsym/dlopen and never allocates. Every clock read goes to the kernel with syscall(2).
 *
 * CLOCK_REALTIME and CLOCK_REALTIME_COARSE (through clock_gettime, gettimeofday and time) read the real
 * clock plus the offset; every other clock (CLOCK_MONOTONIC, CLOCK_BOOTTIME...) is passed through.
 *
 * The offset lives in the file named by $DISTLOCK_CLOCK_OFFSET_FILE, mapped read-only and MAP_SHARED on the
 * first wall-clock read, so a pwrite(2) by the test is seen by the next read:
 *   bytes 0..8   the offset in nanoseconds (signed, native endianness; positive = ahead of the real clock)
 *   bytes 8..16  its bitwise complement, a check against reading a half-written pair
 * An unset variable, or a file that cannot be opened or mapped, means offset 0 for the process's life. The file
 * must keep its 16 bytes while mapped (reading a mapping past the end of its file raises SIGBUS).
 *
 * Every clock read is a system call, also for the clocks passed through (no vDSO without dlsym): a few hundred
 * nanoseconds each, nothing next to a Redis command's round trip. */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define OFFSET_FILE_VAR "DISTLOCK_CLOCK_OFFSET_FILE"
#define OFFSET_FILE_LEN 16

/* Declared here rather than taken from <sys/time.h>, whose declaration of gettimeofday's second parameter
 * differs between glibc versions. Same layout as struct timeval on Linux. */
struct shim_timeval {
    long tv_sec;
    long tv_usec;
};
int gettimeofday(struct shim_timeval *tv, void *tz);

/* NULL: not mapped yet; NO_FILE: nothing to map (offset 0); else the mapped offset file. */
static volatile int64_t *mapping;
static int64_t no_file;
#define NO_FILE (&no_file)

static volatile int64_t *map_offset_file(void) {
    const char *path = getenv(OFFSET_FILE_VAR);
    if (path == NULL || *path == '\0') return NO_FILE;
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NO_FILE;
    long addr = syscall(SYS_mmap, NULL, (long)OFFSET_FILE_LEN, (long)PROT_READ, (long)MAP_SHARED, fd, 0L);
    syscall(SYS_close, fd);
    /* The kernel returns -errno (-4095..-1) on failure. */
    if ((unsigned long)addr >= (unsigned long)-4095L) return NO_FILE;
    return (volatile int64_t *)addr;
}

/* The current offset in nanoseconds. Cheap after the first call: two loads from the mapping. */
static int64_t offset_ns(void) {
    volatile int64_t *m = __atomic_load_n(&mapping, __ATOMIC_ACQUIRE);
    if (m == NULL) {
        int saved_errno = errno;
        volatile int64_t *fresh = map_offset_file();
        volatile int64_t *expected = NULL;
        if (__atomic_compare_exchange_n(&mapping, &expected, fresh, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            m = fresh;
        } else {
            /* Another thread mapped it first: use its mapping and drop ours. */
            if (fresh != NO_FILE) syscall(SYS_munmap, (void *)fresh, (long)OFFSET_FILE_LEN);
            m = expected;
        }
        errno = saved_errno;
    }
    if (m == NO_FILE) return 0;
    /* A pair the test is writing at this moment does not match: read again. One that never matches was not
     * written by clock.rs: offset 0 rather than a server that spins forever. */
    for (int attempt = 0; attempt < 1000000; attempt++) {
        int64_t value = __atomic_load_n(&m[0], __ATOMIC_ACQUIRE);
        int64_t check = __atomic_load_n(&m[1], __ATOMIC_ACQUIRE);
        if (check == ~value) return value;
    }
    return 0;
}

static void shift(struct timespec *ts, int64_t ns) {
    int64_t total = (int64_t)ts->tv_nsec + ns % 1000000000L;
    int64_t sec = (int64_t)ts->tv_sec + ns / 1000000000L + total / 1000000000L;
    total %= 1000000000L;
    if (total < 0) {
        total += 1000000000L;
        sec -= 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)total;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long rc = syscall(SYS_clock_gettime, (long)clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts, offset_ns());
    return (int)rc;
}

int gettimeofday(struct shim_timeval *tv, void *tz) {
    struct timespec ts;
    if (tz != NULL) {
        /* The obsolete struct timezone: zone 0, no DST (what glibc reports on Linux). */
        ((int *)tz)[0] = 0;
        ((int *)tz)[1] = 0;
    }
    if (tv == NULL) return 0;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
