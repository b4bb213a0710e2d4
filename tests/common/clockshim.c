/*
 * clockshim: move a process's wall clock by an offset read from a file, for tests of
 * masters whose clock jumps.
 *
 * Loaded with LD_PRELOAD into Debian's redis-server (which libfaketime does not start:
 * jemalloc's start-up recursion). Redis 7 reads its clock through gettimeofday, which glibc
 * serves from the vDSO, so clock_gettime, gettimeofday and time are all defined here.
 * Each calls the raw system call and adds the offset to CLOCK_REALTIME only: the monotonic
 * clock is left alone, as it is when an operator or NTP steps the wall clock. Nothing here
 * allocates (the file is read with open and read into a stack buffer), so it is safe
 * however early the allocator asks for the time.
 *
 * CLOCKSHIM_FILE names the file; it holds the offset in ms (a signed integer), re-read at
 * most every 2 ms.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ms;
static long long read_at_ns = -1;

static long raw(clockid_t id, struct timespec *ts) {
    return syscall(SYS_clock_gettime, id, ts);
}

static long long offset(void) {
    struct timespec m;
    raw(CLOCK_MONOTONIC, &m);
    long long now = m.tv_sec * 1000000000LL + m.tv_nsec;
    long long last = __atomic_load_n(&read_at_ns, __ATOMIC_RELAXED);
    if (last >= 0 && now - last < 2000000LL) {
        return __atomic_load_n(&offset_ms, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&read_at_ns, now, __ATOMIC_RELAXED);
    const char *path = getenv("CLOCKSHIM_FILE");
    if (!path) {
        return 0;
    }
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
    if (fd < 0) {
        return __atomic_load_n(&offset_ms, __ATOMIC_RELAXED);
    }
    char buf[32];
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) {
        return __atomic_load_n(&offset_ms, __ATOMIC_RELAXED);
    }
    buf[n] = 0;
    long long value = 0;
    int sign = 1, i = 0;
    if (buf[0] == '-') {
        sign = -1;
        i = 1;
    }
    for (; buf[i] >= '0' && buf[i] <= '9'; i++) {
        value = value * 10 + (buf[i] - '0');
    }
    __atomic_store_n(&offset_ms, sign * value, __ATOMIC_RELAXED);
    return sign * value;
}

static void shift(struct timespec *ts) {
    long long ns = ts->tv_sec * 1000000000LL + ts->tv_nsec + offset() * 1000000LL;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    long r = raw(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    raw(CLOCK_REALTIME, &ts);
    shift(&ts);
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    raw(CLOCK_REALTIME, &ts);
    shift(&ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
