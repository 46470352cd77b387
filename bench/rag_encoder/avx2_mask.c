/* Make this process see an AVX2-only x86 CPU: an LD_PRELOAD shim (bench/rag_encoder/avx2_native.py).

   Needs CPUID faulting (`cpuid_fault` in /proc/cpuinfo): after arch_prctl(ARCH_SET_CPUID, 0) every
   user-space CPUID raises SIGSEGV (the setting is per thread, inherited by new threads, reset by
   execve, where this shim loads again). The handler runs the real instruction with faulting
   switched off for a moment, clears the AVX-512, VNNI and AMX bits, and steps over it (2 bytes).
   So onnxruntime (MLAS, cpuinfo), numpy and OpenBLAS choose their kernels as on an AVX2 CPU and
   run natively. /proc/cpuinfo, which tether reads for its CPU summary, is served with the same
   flags removed. Not masked: glibc's own string functions, chosen by ld.so before this shim
   loads (GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,... does that), and XGETBV (not faulted; every
   library checked also requires the CPUID bits).

   Build: gcc -O2 -shared -fPIC -o avx2_mask.so avx2_mask.c -ldl
   If faulting cannot be switched on, the shim prints one line to stderr and masks nothing. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))

static int active;
static int cpuinfo_fd = -1;
static struct sigaction app_segv; /* what the program asked for SIGSEGV: run for faults not ours */
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);

static long set_cpuid(int on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on); }

static void mask(uint32_t leaf, uint32_t sub, uint32_t r[4]) { /* r: eax ebx ecx edx */
    if (leaf == 7 && sub == 0) {
        /* AVX512F DQ IFMA PF ER CD BW VL */
        r[1] &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
        /* AVX512_VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
        r[2] &= ~(BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14));
        /* AVX512_4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16, AMX_TILE, AMX_INT8 */
        r[3] &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
    } else if (leaf == 7 && sub == 1) {
        /* AVX_VNNI, AVX512_BF16, AMX_FP16, AVX_IFMA */
        r[0] &= ~(BIT(4) | BIT(5) | BIT(21) | BIT(23));
        /* AVX_VNNI_INT8, AVX_NE_CONVERT, AMX_COMPLEX, AVX_VNNI_INT16, AVX10 */
        r[3] &= ~(BIT(4) | BIT(5) | BIT(8) | BIT(10) | BIT(19));
    } else if (leaf == 0xd && sub == 0) {
        r[0] &= ~(BIT(5) | BIT(6) | BIT(7) | BIT(17) | BIT(18)); /* opmask, ZMM, AMX tile state */
    } else if (leaf == 0x1d || leaf == 0x1e || leaf == 0x24) {
        r[0] = r[1] = r[2] = r[3] = 0; /* AMX tile and AVX10 leaves */
    }
}

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    greg_t *g = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    if (si->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) {
        uint32_t leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX], r[4];
        set_cpuid(1);
        __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
        set_cpuid(0);
        mask(leaf, sub, r);
        g[REG_RAX] = r[0];
        g[REG_RBX] = r[1];
        g[REG_RCX] = r[2];
        g[REG_RDX] = r[3];
        g[REG_RIP] += 2;
        return;
    }
    if (app_segv.sa_flags & SA_SIGINFO) {
        app_segv.sa_sigaction(sig, si, ctx);
    } else if (app_segv.sa_handler != SIG_DFL && app_segv.sa_handler != SIG_IGN) {
        app_segv.sa_handler(sig);
    } else { /* a real crash: die of it as without the shim */
        struct sigaction dfl = {0};
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGSEGV, &dfl, NULL);
    }
}

/* The program's own SIGSEGV handler (Python's faulthandler, a JIT) is kept and chained, not installed. */
int sigaction(int signum, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(RTLD_NEXT, "sigaction");
    if (!active || signum != SIGSEGV) return real_sigaction(signum, act, old);
    if (old) *old = app_segv;
    if (act) app_segv = *act;
    return 0;
}

static int is_cpuinfo(const char *path) { return cpuinfo_fd >= 0 && path && strcmp(path, "/proc/cpuinfo") == 0; }

static int cpuinfo_copy(void) {
    int fd = (int)syscall(SYS_memfd_create, "cpuinfo", 0);
    if (fd < 0) return -1;
    /* copy the whole (already filtered) memfd: each open gets its own offset */
    off_t size = lseek(cpuinfo_fd, 0, SEEK_END);
    char buf[65536];
    for (off_t at = 0; at < size;) {
        ssize_t n = pread(cpuinfo_fd, buf, sizeof buf, at);
        if (n <= 0) break;
        if (write(fd, buf, (size_t)n) != n) break;
        at += n;
    }
    lseek(fd, 0, SEEK_SET);
    return fd;
}

#define OPEN_LIKE(name, ...)                                                              \
    int name(__VA_ARGS__, int flags, ...) {                                               \
        static int (*real)();                                                             \
        mode_t mode = 0;                                                                  \
        if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {                                              \
            va_list ap;                                                                   \
            va_start(ap, flags);                                                          \
            mode = va_arg(ap, mode_t);                                                    \
            va_end(ap);                                                                   \
        }                                                                                 \
        if (is_cpuinfo(path)) return cpuinfo_copy();                                      \
        if (!real) real = (int (*)())dlsym(RTLD_NEXT, #name);                             \
        return OPEN_CALL;                                                                 \
    }
#define OPEN_CALL real(path, flags, mode)
OPEN_LIKE(open, const char *path)
OPEN_LIKE(open64, const char *path)
#undef OPEN_CALL
#define OPEN_CALL real(dirfd, path, flags, mode)
OPEN_LIKE(openat, int dirfd, const char *path)
OPEN_LIKE(openat64, int dirfd, const char *path)

FILE *fopen(const char *path, const char *how) {
    static FILE *(*real)(const char *, const char *);
    if (is_cpuinfo(path)) return fdopen(cpuinfo_copy(), "r");
    if (!real) real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    return real(path, how);
}
FILE *fopen64(const char *path, const char *how) { return fopen(path, how); }

static int hidden_flag(const char *w, size_t n) {
    static const char *prefixes[] = {"avx512", "amx", "avx_vnni", "avx_ifma", "avx_ne_convert", "avx10", NULL};
    for (const char **p = prefixes; *p; p++)
        if (n >= strlen(*p) && strncmp(w, *p, strlen(*p)) == 0) return 1;
    return 0;
}

/* /proc/cpuinfo with the masked features' flags removed from every `flags` line. */
static void filter_cpuinfo(void) {
    int in = (int)syscall(SYS_openat, AT_FDCWD, "/proc/cpuinfo", O_RDONLY);
    int out = (int)syscall(SYS_memfd_create, "cpuinfo", 0);
    if (in < 0 || out < 0) return;
    static char text[1 << 20];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof text - 1 && (n = read(in, text + len, sizeof text - 1 - len)) > 0) len += (size_t)n;
    close(in);
    text[len] = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t ll = end ? (size_t)(end - line) + 1 : strlen(line);
        if (strncmp(line, "flags", 5) == 0 && memchr(line, ':', ll)) {
            char *colon = memchr(line, ':', ll);
            if (write(out, line, (size_t)(colon - line) + 1) < 0) return;
            for (char *w = colon + 1; w < line + ll;) {
                while (w < line + ll && (*w == ' ' || *w == '\t' || *w == '\n')) w++;
                char *e = w;
                while (e < line + ll && *e != ' ' && *e != '\t' && *e != '\n') e++;
                if (e > w && !hidden_flag(w, (size_t)(e - w))) {
                    if (write(out, " ", 1) < 0 || write(out, w, (size_t)(e - w)) < 0) return;
                }
                w = e;
            }
            if (write(out, "\n", 1) < 0) return;
        } else if (write(out, line, ll) < 0) {
            return;
        }
        line += ll;
    }
    cpuinfo_fd = out;
}

__attribute__((constructor)) static void start(void) {
    if (!real_sigaction) real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(RTLD_NEXT, "sigaction");
    struct sigaction sa = {0};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (real_sigaction(SIGSEGV, &sa, &app_segv) != 0 || set_cpuid(0) != 0) {
        real_sigaction(SIGSEGV, &app_segv, NULL);
        fprintf(stderr, "avx2_mask: CPUID faulting is not available here; nothing is masked\n");
        return;
    }
    active = 1;
    filter_cpuinfo();
}
