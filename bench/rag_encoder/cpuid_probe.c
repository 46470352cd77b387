/* Print the CPUID feature bits the AVX2 mask hides, as JSON: bench/rag_encoder/avx2_native.py runs it
   with and without avx2_mask.so to show the mask holds. Build: gcc -O2 -o cpuid_probe cpuid_probe.c */
#include <cpuid.h>
#include <stdio.h>

int main(void) {
    unsigned a, b, c, d, a1 = 0, d1 = 0;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned b7 = b, c7 = c, d7 = d;
    __cpuid_count(7, 1, a1, b, c, d1);
    __cpuid_count(1, 0, a, b, c, d);
    printf("{\"avx\": %d, \"fma\": %d, \"avx2\": %d, \"avx512f\": %d, \"avx512bw\": %d, \"avx512vl\": %d, "
           "\"avx512_vnni\": %d, \"avx_vnni\": %d, \"avx512_bf16\": %d, \"amx_tile\": %d, \"amx_int8\": %d}\n",
           (c >> 28) & 1, (c >> 12) & 1, (b7 >> 5) & 1, (b7 >> 16) & 1, (b7 >> 30) & 1, (b7 >> 31) & 1,
           (c7 >> 11) & 1, (a1 >> 4) & 1, (a1 >> 5) & 1, (d7 >> 24) & 1, (d7 >> 25) & 1);
    (void)d1;
    return 0;
}
