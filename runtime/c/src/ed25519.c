/* Ed25519 signature check: Monocypher 4.0.3 (vendor/monocypher, CC0 / BSD-2-Clause), its
 * optional Ed25519 (SHA-512) variant, the one runtime/signing.py's `cryptography` checks. */
#include "internal.h"
#include "monocypher-ed25519.h"

int mlc_ed25519_verify(const uint8_t sig[64], const uint8_t pub[32], const uint8_t *msg, size_t n)
{
    return crypto_ed25519_check(sig, pub, msg, n) == 0;
}
