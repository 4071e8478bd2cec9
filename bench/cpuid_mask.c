/* LD_PRELOAD shim: CPUID as an AVX2 + FMA host answers it (no AVX-512, no VNNI, no BF16).
 *
 * Linux CPUID faulting (arch_prctl ARCH_SET_CPUID, /proc/cpuinfo flag "cpuid_fault") makes the
 * cpuid instruction raise SIGSEGV in this process; the handler runs the real cpuid with
 * faulting off, clears the AVX-512 / AVX-VNNI / AMX feature bits, and steps over the
 * instruction. Peers that choose their kernels by CPUID (ONNX Runtime's MLAS, OpenVINO's
 * oneDNN, numpy) then take their AVX2 paths. Only for benchmarks (bench/avx2_host.py). */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static struct sigaction previous;

static void real_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

static void on_segv(int sig, siginfo_t *info, void *ctx) {
    ucontext_t *uc = (ucontext_t *)ctx;
    unsigned char *ip = (unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    if (ip[0] != 0x0f || ip[1] != 0xa2) {       /* not cpuid: the previous disposition */
        sigaction(SIGSEGV, &previous, NULL);
        return;                                  /* the instruction faults again */
    }
    uint32_t leaf = (uint32_t)uc->uc_mcontext.gregs[REG_RAX];
    uint32_t sub = (uint32_t)uc->uc_mcontext.gregs[REG_RCX];
    uint32_t r[4];
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    real_cpuid(leaf, sub, r);
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
    if (leaf == 7 && sub == 0) {
        r[1] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) |
                  (1u << 30) | (1u << 31));                         /* EBX: F DQ IFMA PF ER CD BW VL */
        r[2] &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));  /* ECX: VBMI VBMI2 VNNI BITALG VPOPCNTDQ */
        r[3] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) |
                  (1u << 25));                                      /* EDX: 4VNNIW 4FMAPS VP2INTERSECT AMX-BF16 FP16 AMX-TILE AMX-INT8 */
    } else if (leaf == 7 && sub == 1) {
        r[0] &= ~((1u << 4) | (1u << 5));                           /* EAX: AVX-VNNI, AVX512_BF16 */
    } else if (leaf == 0xd && sub == 0) {
        r[0] &= ~(0xe0u);                                           /* XCR0 bits for opmask / ZMM state */
    }
    uc->uc_mcontext.gregs[REG_RAX] = r[0];
    uc->uc_mcontext.gregs[REG_RBX] = r[1];
    uc->uc_mcontext.gregs[REG_RCX] = r[2];
    uc->uc_mcontext.gregs[REG_RDX] = r[3];
    uc->uc_mcontext.gregs[REG_RIP] += 2;
    (void)sig; (void)info;
}

__attribute__((constructor)) static void mask_cpuid(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous);
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
}
