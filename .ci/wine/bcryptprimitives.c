/*
 * A stand-in for Windows' bcryptprimitives.dll, for wine only (see .ci/wine-run).
 *
 * Rust's standard library (1.78 and later) takes its random seeds (HashMap keys) from
 * ProcessPrng in bcryptprimitives.dll, which every Windows since 10 has. The Wine 8.0 of Debian 12
 * has no such DLL, so every Rust .exe fails to start there ("Library bcryptprimitives.dll ...
 * not found", exit code 53). This DLL exports ProcessPrng and forwards it to wine's own
 * BCryptGenRandom with the system RNG: no random numbers are made here. It is installed only into
 * the wine prefix the tests use, never shipped, and not used where wine has the DLL itself.
 */
#include <windows.h>
#include <bcrypt.h>

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!BCRYPT_SUCCESS(BCryptGenRandom(NULL, data, n, BCRYPT_USE_SYSTEM_PREFERRED_RNG)))
            return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
