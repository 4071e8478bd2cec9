"""Float32 math functions generated as LLVM IR, so that kernels never call scalar libm.

Each function is an internal, ``alwaysinline`` ``float @"mlc.math.<name>"(float)`` built only
from arithmetic, bit casts, selects and intrinsics that lower to instructions (``llvm.fabs``,
``llvm.fmuladd``, ``llvm.sqrt``, ``llvm.copysign``). Once inlined into a loop, LLVM's loop
vectorizer turns it into packed SIMD code (AVX2 / AVX-512 / NEON), and the object file needs
no external symbol the runtime loader would have to resolve. The dotted name cannot collide
with a kernel symbol ``mlc_<prim func>`` (a kernel legalized from ``tanh`` is ``mlc_tanh``).

Every body is branch-free: both sides of a piecewise approximation are computed and a
``select`` picks one, which is what the vectorizer wants. NaN and infinities propagate
without fast-math flags; polynomials use ``llvm.fmuladd``, which fuses to an FMA where the
target has one and stays a multiply and an add where it has none (``llvm.fma`` would become
a libm ``fmaf`` call on x86-64-v2).

Measured against float64 on float32 inputs (10^7 points each): exp <= 1.0 ulp on [-87, 88],
log <= 0.8 ulp, erf <= 6.9e-8 absolute (1.15 ulp); sqrt is correctly rounded. On every 1e-3 of
[-20, 20] and the tails to +-100: sigmoid, 1/(1 + e^-x) with a cheaper e^-x than exp's
(``exp_neg_parts``), <= 8.8e-8 absolute, 2.7e-7 relative (4.2e-7 in the tails down to FLT_MIN);
tanh, a clamped rational x P(x^2)/Q(x^2), <= 2.4e-7 absolute and relative. Per element on Zen 3
AVX2, one core (bench/vecmath_bench.py): sigmoid 0.31-0.38 ns (ONNX Runtime's
MlasComputeLogistic 0.42-0.48; the former exp-based form 0.75), tanh 0.32-0.38 ns (ORT 0.42,
formerly 1.2), erf 0.95 ns (ORT 0.81, formerly 1.2: its tail now takes sigmoid's e^-z).

sin, cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh and atanh compute in float64 inside
(range reduction and Taylor polynomials with exact rational coefficients, float64 exp/log built
the same way) and round once to float32: 0.5 ulp max on 400k points each over their whole
domains, sin/cos/tan included up to 3.4e38 (Cody-Waite reduction below 2^20, glibc's branch-free
product with the bits of 2/pi above). The loops vectorize in float64 lanes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from math import factorial

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)

INF = float("inf")
NAN = float("nan")
FLT_MIN = 2.0**-126

# Cephes expf: 2^n split of exp, ln2 as a 9-bit head (n*C1 exact) plus tail.
EXP_LOG2E = 1.44269504088896341
EXP_LN2_HI = 0.693359375
EXP_LN2_LO = -2.12194440e-4
# Cephes expf: minimax polynomial for (exp(r) - 1 - r) / r^2 on [-ln2/2, ln2/2].
EXP_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
# Below -104 the result rounds to 0 even as a denormal; above 89 it is +inf.
# Clamping there keeps the integer exponent n in [-150, 128] (two in-range scale factors).
EXP_LO = -104.0
EXP_HI = 89.0
ROUND_MAGIC = 12582912.0  # 1.5 * 2^23: x + this rounds x to an integer for |x| < 2^22

# Cephes logf: polynomial for (log(1+f) - f + f^2/2) / f^3, f in [sqrt(1/2)-1, sqrt(2)-1].
LOG_POLY = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
LOG_SQRT2 = 1.41421356237309505

# Norbert Juffa's faithfully rounded erff (stackoverflow.com/a/35148198), two pieces
# split at |x| = 475/512: odd polynomial below, 1 - exp(poly(|x|)) above.
ERF_SPLIT = 0.927734375
ERF_SMALL_POLY = (
    -5.96761703e-4,
    4.99119423e-3,
    -2.67681349e-2,
    1.12819925e-1,
    -3.76125336e-1,
    1.28379166e-1,
)
ERF_LARGE_POLY_HI = (-1.72853470e-5, 3.83197126e-4)
ERF_LARGE_POLY_MID = (-3.88396438e-3, 2.42546219e-2)
ERF_LARGE_POLY_LO = (-1.06777877e-1, -6.34846687e-1, -1.28717512e-1)


SYMBOL_PREFIX = "mlc.math."


class _Ops:
    """Scalar float32 building blocks over one IRBuilder; keeps the bodies below short."""

    def __init__(self, builder: ir.IRBuilder) -> None:
        self.b = builder
        self.module = builder.module

    def c(self, value: float) -> ir.Constant:
        return ir.Constant(F32, value)

    def ci(self, value: int) -> ir.Constant:
        return ir.Constant(I32, value)

    def _intrinsic(self, name: str, nargs: int) -> ir.Function:
        fnty = ir.FunctionType(F32, [F32] * nargs)
        return self.module.declare_intrinsic(name, [F32], fnty)

    def fabs(self, x: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("llvm.fabs", 1), [x])

    def sqrt(self, x: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("llvm.sqrt", 1), [x])

    def copysign(self, magnitude: ir.Value, sign: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("llvm.copysign", 2), [magnitude, sign])

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("llvm.fmuladd", 3), [a, b, c])

    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fadd(a, b)

    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fsub(a, b)

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fmul(a, b)

    def div(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fdiv(a, b)

    def cmp(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        """Ordered comparison (false when either side is NaN)."""
        return self.b.fcmp_ordered(op, a, b)

    def cmp_u(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        """Unordered comparison (true when either side is NaN)."""
        return self.b.fcmp_unordered(op, a, b)

    def is_nan(self, x: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", x, x)

    def select(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.select(cond, a, b)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """min(max(x, lo), hi) with NaN sent to lo; x86 lowers each select to one max/min."""
        x = self.select(self.cmp_u("<", x, self.c(lo)), self.c(lo), x)
        return self.select(self.cmp(">", x, self.c(hi)), self.c(hi), x)

    def horner(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """coeffs[0]*x^(k-1) + ... + coeffs[-1], highest degree first."""
        acc = self.c(coeffs[0])
        for coeff in coeffs[1:]:
            acc = self.fma(acc, x, self.c(coeff))
        return acc

    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, I32)

    def from_bits(self, i: ir.Value) -> ir.Value:
        return self.b.bitcast(i, F32)

    def pow2(self, n: ir.Value) -> ir.Value:
        """2.0**n for an i32 n in [-126, 127], built in the exponent field."""
        return self.from_bits(self.b.shl(self.b.add(n, self.ci(127)), self.ci(23)))

    def call(self, name: str, x: ir.Value) -> ir.Value:
        return self.b.call(math_function(self.module, name), [x])


def _emit_exp(m: _Ops, x: ir.Value) -> ir.Value:
    xc = m.clamp(x, EXP_LO, EXP_HI)
    # n = round(x / ln2) by adding 1.5 * 2^23: the sum's low mantissa bits hold n as an
    # integer (no llvm.rint, which is a libm call on x86-64 before SSE4.1, no fptosi).
    shifted = m.add(m.mul(xc, m.c(EXP_LOG2E)), m.c(ROUND_MAGIC))
    n = m.sub(shifted, m.c(ROUND_MAGIC))
    ni = m.b.sub(m.bits(shifted), m.bits(m.c(ROUND_MAGIC)))
    r = m.fma(n, m.c(-EXP_LN2_HI), xc)
    r = m.fma(n, m.c(-EXP_LN2_LO), r)
    p = m.horner(r, EXP_POLY)
    y = m.add(m.fma(p, m.mul(r, r), r), m.c(1.0))
    # Scale by 2^n as 2^n1 * 2^n2 so that n down to -150 gives a correctly rounded
    # denormal and n = 128 overflows to +inf instead of wrapping the exponent field.
    n1 = m.b.ashr(ni, m.ci(1))
    n2 = m.b.sub(ni, n1)
    y = m.mul(m.mul(y, m.pow2(n1)), m.pow2(n2))
    return m.select(m.is_nan(x), x, y)


# ln(FLT_MIN): exp_nonpositive takes its argument no lower than this, so 2^n stays a normal
# number (one scale factor, no denormal path).
EXP_NONPOSITIVE_MIN = -87.33654


def exp_nonpositive(m: _Ops, d: ir.Value) -> ir.Value:
    """exp(d) for d <= 0 or NaN (kept NaN): exp's reduction and polynomial, so the same values
    down to EXP_NONPOSITIVE_MIN, below which it gives ~1.2e-38 instead of a denormal or 0,
    without what d <= 0 never needs (the overflow clamp, the two-step scale for denormal
    results, the NaN select: NaN passes the clamp and poisons the arithmetic). 17 operations
    instead of 26, for softmax's exp(x - max) and erf's exp(-t^2 + ...) where a result that
    small is lost in a sum >= 1 or in 1 - it."""
    lo = m.c(EXP_NONPOSITIVE_MIN)
    d = m.select(m.cmp("<", d, lo), lo, d)
    shifted = m.fma(d, m.c(EXP_LOG2E), m.c(ROUND_MAGIC))
    n = m.sub(shifted, m.c(ROUND_MAGIC))
    ni = m.b.sub(m.bits(shifted), m.bits(m.c(ROUND_MAGIC)))
    r = m.fma(n, m.c(-EXP_LN2_HI), d)
    r = m.fma(n, m.c(-EXP_LN2_LO), r)
    p = m.horner(r, EXP_POLY)
    y = m.add(m.fma(p, m.mul(r, r), r), m.c(1.0))
    return m.mul(y, m.pow2(ni))


def _emit_log(m: _Ops, x: ir.Value) -> ir.Value:
    # Denormal inputs: scale into the normal range first, take 23 off the exponent later.
    denormal = m.cmp("<", x, m.c(FLT_MIN))
    xs = m.select(denormal, m.mul(x, m.c(2.0**23)), x)
    bits = m.bits(xs)
    exponent = m.b.sub(m.b.and_(m.b.lshr(bits, m.ci(23)), m.ci(0xFF)), m.ci(127))
    exponent = m.b.sub(exponent, m.b.select(denormal, m.ci(23), m.ci(0)))
    # Mantissa in [1, 2), then folded into [sqrt(1/2), sqrt(2)) around 1.
    mant = m.from_bits(m.b.or_(m.b.and_(bits, m.ci(0x007FFFFF)), m.ci(0x3F800000)))
    fold = m.cmp(">", mant, m.c(LOG_SQRT2))
    mant = m.select(fold, m.mul(mant, m.c(0.5)), mant)
    exponent = m.b.add(exponent, m.b.zext(fold, I32))
    f = m.sub(mant, m.c(1.0))
    z = m.mul(f, f)
    e = m.b.sitofp(exponent, F32)
    y = m.mul(m.mul(m.horner(f, LOG_POLY), f), z)
    y = m.fma(e, m.c(EXP_LN2_LO), y)
    y = m.fma(z, m.c(-0.5), y)
    y = m.add(f, y)
    y = m.fma(e, m.c(EXP_LN2_HI), y)
    # Special values: log(+inf) = +inf, log(+-0) = -inf, log(x < 0) = log(NaN) = NaN.
    y = m.select(m.cmp("==", x, m.c(INF)), m.c(INF), y)
    y = m.select(m.cmp("==", x, m.c(0.0)), m.c(-INF), y)
    return m.select(m.cmp_u("<", x, m.c(0.0)), m.c(NAN), y)


# Sigmoid's e^(-z), cheaper than exp's (no exp call, no range select, one division after it):
#   n = round(-z log2e), r = z + n ln2 (one fma, ln2 rounded to float32: |n| <= 128 keeps
#   n * (ln2 - ln2_f32) under 2.4e-7), e^(-z) = 2^n e^(-r), e^(-r) a degree-5 polynomial on
#   |r| <= ln2/2 (relative minimax, constant term 1 so that sigmoid(0) = 1/2 exactly: 1.5e-7
#   relative in float32), 2^n placed in the exponent field by one shift of the rounding sum's
#   bits (its magic constant carries the exponent bias); the caller's 1 + q 2^n is one fma.
# 12 operations and 9 constants, where exp's path took 17 and the range-select around it 7 more.
EXPNEG_POLY = (-8.290315e-3, 4.189793e-2, -1.6667636e-1, 4.999915e-1, -9.999997e-1, 1.0)
EXPNEG_LOG2E = 1.442695
EXPNEG_LN2 = 0.6931472
# 1.5 * 2^23 + 127: the sum's bits are bits(1.5 * 2^23) + 127 + n; shifted left by 23 they are
# (127 + n) << 23 (the constant's own bits above bit 8 shift out), the float 2^n.
ROUND_MAGIC_BIASED = ROUND_MAGIC + 127.0
# z >= SIGMOID_Z_MIN rounds n up to 128 at the bound: the exponent field 255 with a zero
# mantissa is +inf, so sigmoid(z <= -88.4) = 1/(1 + inf) = 0 exactly (the true value is a
# denormal below 4e-39). z <= SIGMOID_Z_MAX keeps n >= -116 (e^-80 is lost next to 1 anyway).
SIGMOID_Z_MIN = -88.5
SIGMOID_Z_MAX = 80.0


def exp_neg_parts(m: _Ops, z: ir.Value, lo: float | None = SIGMOID_Z_MIN,
                  hi: float = SIGMOID_Z_MAX) -> tuple[ir.Value, ir.Value]:
    """(q, s) with e^(-z) = q * s within 2e-7 relative, q in [0.7, 1.42] and s = 2^n, for z
    in [lo, hi] (clamped there; ``lo`` None when the caller's z >= 0); NaN stays NaN in q
    (ordered compares keep it through the clamp, the arithmetic propagates it); z <= -88.4
    (-inf included) gives s = +inf."""
    if lo is not None:
        z = m.select(m.cmp("<", z, m.c(lo)), m.c(lo), z)
    z = m.select(m.cmp(">", z, m.c(hi)), m.c(hi), z)
    shifted = m.fma(z, m.c(-EXPNEG_LOG2E), m.c(ROUND_MAGIC_BIASED))
    n = m.sub(shifted, m.c(ROUND_MAGIC_BIASED))
    r = m.fma(n, m.c(EXPNEG_LN2), z)
    q = m.horner(r, EXPNEG_POLY)
    return q, m.from_bits(m.b.shl(m.bits(shifted), m.ci(23)))


# tanh(x) = x P(x^2) / Q(x^2) on |x| <= 9, degrees 4 and 4 in x^2 (a relative minimax fit,
# 2e-8 in exact arithmetic, 2.4e-7 evaluated in float32), P(0) = Q(0) = 1 so that tanh(x) = x
# for tiny x (denormals, -0 included). Past 9 the clamped argument gives 1 to float32 precision,
# and the result is clamped to [-1, 1]. 14 operations and one division: no exp, no select
# between a small and a large branch.
TANH_RATIONAL_P = (1.3358368e-08, 2.0611849e-05, 3.4957603e-03, 1.3381173e-01, 1.0)
TANH_RATIONAL_Q = (7.7781021e-07, 3.2859136e-04, 2.5877642e-02, 4.6714488e-01, 1.0)
TANH_CLAMP = 9.0


def _emit_tanh(m: _Ops, x: ir.Value) -> ir.Value:
    # Ordered compares keep NaN through both clamps; +-inf clamp to +-9, hence +-1.
    xc = m.select(m.cmp("<", x, m.c(-TANH_CLAMP)), m.c(-TANH_CLAMP), x)
    xc = m.select(m.cmp(">", xc, m.c(TANH_CLAMP)), m.c(TANH_CLAMP), xc)
    z = m.mul(xc, xc)
    y = m.div(m.mul(xc, m.horner(z, TANH_RATIONAL_P)), m.horner(z, TANH_RATIONAL_Q))
    y = m.select(m.cmp("<", y, m.c(-1.0)), m.c(-1.0), y)
    return m.select(m.cmp(">", y, m.c(1.0)), m.c(1.0), y)


def _emit_sigmoid(m: _Ops, x: ir.Value) -> ir.Value:
    # 1/(1 + e^-x): e^-x = +inf below -88.4 gives 0 (sigmoid(-inf) = 0), e^-x -> 0 gives 1;
    # the quotient of a value near 1 keeps full relative accuracy for x < 0 as well.
    q, scale = exp_neg_parts(m, x)
    return m.div(m.c(1.0), m.fma(q, scale, m.c(1.0)))


def _emit_erf(m: _Ops, x: ir.Value) -> ir.Value:
    t = m.fabs(x)
    s = m.mul(x, x)
    small = m.fma(m.horner(s, ERF_SMALL_POLY), x, x)
    # Large |t|: 1 - e^-z with z = -poly(t), built from the negated coefficients (z = t + ...
    # needs no negation); z goes to +inf with t, e^-z to 0 (exp_neg_parts clamps z at 80), so
    # erf(+-inf) = +-1. z >= 0.93 here (or NaN: then the small branch, also NaN, is taken).
    z = m.horner(t, [-c for c in ERF_LARGE_POLY_HI])
    u = m.horner(t, [-c for c in ERF_LARGE_POLY_MID])
    z = m.fma(z, s, u)
    for coeff in ERF_LARGE_POLY_LO:
        z = m.fma(z, t, m.c(-coeff))
    z = m.fma(z, t, t)
    q, scale = exp_neg_parts(m, z, lo=None)
    large = m.copysign(m.fma(m.b.fneg(q), scale, m.c(1.0)), x)
    return m.select(m.cmp(">", t, m.c(ERF_SPLIT)), large, small)


def _emit_sqrt(m: _Ops, x: ir.Value) -> ir.Value:
    return m.sqrt(x)


# ---- trigonometric and hyperbolic functions: evaluated in float64, rounded once to float32 -----
#
# A float32 result computed in double with a relative error below ~1e-12 rounds to the correctly
# rounded float in all but a vanishing fraction of cases, so these stay within 1 ulp without the
# error-compensation tricks a float32-only evaluation needs. Polynomials are Taylor series with
# exact rational coefficients, cut where the truncation error is below 1e-13 relative on the
# reduced range (the double evaluation, ~1e-16, is far below float32's 6e-8 anyway).

F64 = ir.DoubleType()
I64 = ir.IntType(64)


def _taylor(term: Callable[[int], Fraction], count: int) -> tuple[float, ...]:
    """``count`` coefficients term(0), term(1), ... as doubles, highest degree first (horner)."""
    return tuple(float(term(n)) for n in reversed(range(count)))


# sin(r) = r + r^3 * S(r^2), cos(r) = 1 + r^2 * C(r^2) on |r| <= pi/4.
SIN_POLY = _taylor(lambda n: Fraction((-1) ** (n + 1), factorial(2 * n + 3)), 6)
COS_POLY = _taylor(lambda n: Fraction((-1) ** (n + 1), factorial(2 * n + 2)), 7)
# asin(s) = s + s^3 * A(s^2) on s^2 <= 1/4: coefficient (2n)! / (4^n n!^2 (2n+1)) of s^(2n+1).
ASIN_POLY = _taylor(lambda n: Fraction(factorial(2 * n + 2),
                                       4 ** (n + 1) * factorial(n + 1) ** 2 * (2 * n + 3)), 20)
# atan(u) = u + u^3 * T(u^2) on |u| <= tan(pi/12).
ATAN_POLY = _taylor(lambda n: Fraction((-1) ** (n + 1), 2 * n + 3), 12)
ATAN_SPLIT = 0.2679491924311227  # tan(pi/12) = 2 - sqrt(3)
SQRT3 = 1.7320508075688772
# sinh(a) = a + a^3 * H(a^2) for a < 1.
SINH_POLY = _taylor(lambda n: Fraction(1, factorial(2 * n + 3)), 8)
# exp(r) = 1 + r + r^2 * E(r) on |r| <= ln2/2; log(m) = 2 atanh(s) = 2s + s^3 * L(s^2).
EXP64_POLY = _taylor(lambda n: Fraction(1, factorial(n + 2)), 13)
LOG64_POLY = _taylor(lambda n: Fraction(2, 2 * n + 3), 10)
LN2_HI64 = 6.93147180369123816490e-01  # fdlibm: ln2 with 32 trailing zero bits, then the rest
LN2_LO64 = 1.90821492927058770002e-10
LOG2E64 = 1.4426950408889634
ROUND_MAGIC64 = 6755399441055744.0  # 1.5 * 2^52
PI64 = 3.141592653589793
PIO2_64 = 1.5707963267948966
PIO6_64 = 0.5235987755982988
# Cody-Waite pi/2 for |x| < 2^20: a 33-bit head (n * head is exact) and the rest (fdlibm).
PIO2_HI = 1.57079632673412561417e+00
PIO2_LO = 6.07710050650619224932e-11
INV_PIO2 = 0.6366197723675814
TRIG_FAST_LIMIT = 2.0**20
PI63 = 1.5707963267948966 * 2.0**-62  # pi/2 scaled to the 62-bit fraction of reduce_large


def _pi_bits(bits: int) -> int:
    """floor(pi * 2^bits), by Machin's formula in integers (guard bits discarded)."""
    guard = bits + 32
    one = 1 << guard

    def arctan_inv(k: int) -> int:
        total, term, n, sign = 0, one // k, 1, 1
        while term:
            total += sign * (term // n)
            term //= k * k
            n += 2
            sign = -sign
        return total

    return (16 * arctan_inv(5) - 4 * arctan_inv(239)) >> 32


_PI_SCALED = _pi_bits(512)
# 4/pi in 32-bit windows advancing by 8 bits (glibc's __inv_pio4): entry i holds
# floor(4/pi * 2^(8i + 7)) mod 2^32, so entry 3 is 0xa2f9836e.
INV_PIO4 = tuple((((1 << (8 * i + 9 + 512)) // _PI_SCALED) & 0xFFFFFFFF) for i in range(24))


class _Ops64:
    """Double-precision building blocks (and i64 bit tricks) over one IRBuilder."""

    def __init__(self, builder: ir.IRBuilder) -> None:
        self.b = builder
        self.module = builder.module

    def c(self, value: float) -> ir.Constant:
        return ir.Constant(F64, value)

    def ci(self, value: int) -> ir.Constant:
        return ir.Constant(I64, value)

    def _intrinsic(self, name: str, nargs: int) -> ir.Function:
        return self.module.declare_intrinsic(name, [F64], ir.FunctionType(F64, [F64] * nargs))

    def fabs(self, x: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("llvm.fabs", 1), [x])

    def sqrt(self, x: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("llvm.sqrt", 1), [x])

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return self.b.call(self._intrinsic("llvm.fmuladd", 3), [a, b, c])

    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def neg(self, a):
        return self.b.fneg(a)

    def cmp(self, op: str, a, b):
        return self.b.fcmp_ordered(op, a, b)

    def select(self, cond, a, b):
        return self.b.select(cond, a, b)

    def horner(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        acc = self.c(coeffs[0])
        for coeff in coeffs[1:]:
            acc = self.fma(acc, x, self.c(coeff))
        return acc

    def odd(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """x + x^3 * P(x^2)."""
        z = self.mul(x, x)
        return self.fma(self.mul(x, z), self.horner(z, coeffs), x)

    def round_int(self, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(round(x) as double, as i64) for |x| < 2^51, without llvm.rint or fptosi."""
        shifted = self.add(x, self.c(ROUND_MAGIC64))
        n = self.sub(shifted, self.c(ROUND_MAGIC64))
        ni = self.b.sub(self.b.bitcast(shifted, I64), self.b.bitcast(self.c(ROUND_MAGIC64), I64))
        return n, ni

    def exp(self, y: ir.Value) -> ir.Value:
        """e^y for 0 <= y <= 200 (callers clamp)."""
        n, ni = self.round_int(self.mul(y, self.c(LOG2E64)))
        r = self.fma(n, self.c(-LN2_HI64), y)
        r = self.fma(n, self.c(-LN2_LO64), r)
        p = self.fma(self.mul(r, r), self.horner(r, EXP64_POLY), self.add(r, self.c(1.0)))
        scale = self.b.bitcast(self.b.shl(self.b.add(ni, self.ci(1023)), self.ci(52)), F64)
        return self.mul(p, scale)

    def log(self, y: ir.Value) -> ir.Value:
        """log(y) for finite y >= 1 (callers handle infinities)."""
        bits = self.b.bitcast(y, I64)
        e = self.b.sub(self.b.lshr(bits, self.ci(52)), self.ci(1023))
        mant = self.b.bitcast(self.b.or_(self.b.and_(bits, self.ci((1 << 52) - 1)),
                                         self.ci(1023 << 52)), F64)
        fold = self.cmp(">", mant, self.c(1.4142135623730951))
        mant = self.select(fold, self.mul(mant, self.c(0.5)), mant)
        e = self.b.add(e, self.b.zext(fold, I64))
        f = self.sub(mant, self.c(1.0))
        s = self.div(f, self.add(f, self.c(2.0)))
        z = self.mul(s, s)
        log_m = self.fma(self.mul(s, z), self.horner(z, LOG64_POLY), self.add(s, s))
        ed = self.b.sitofp(self.b.trunc(e, I32), F64)
        return self.fma(ed, self.c(0.6931471805599453), log_m)

    def log1p(self, u: ir.Value) -> ir.Value:
        """log(1 + u) for finite u >= 0 with full relative accuracy (Goldberg's correction)."""
        w = self.add(u, self.c(1.0))
        wm1 = self.sub(w, self.c(1.0))
        exact = self.cmp("==", wm1, self.c(0.0))
        safe = self.select(exact, self.c(1.0), wm1)
        return self.select(exact, u, self.div(self.mul(self.log(w), u), safe))


def _inv_pio4_table(module: ir.Module) -> ir.GlobalVariable:
    name = "mlc.const.inv_pio4"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    ty = ir.ArrayType(I32, len(INV_PIO4))
    table = ir.GlobalVariable(module, ty, name=name)
    table.linkage = "internal"
    table.global_constant = True
    table.initializer = ir.Constant(ty, [ir.Constant(I32, v - (1 << 32) if v >= 1 << 31 else v)
                                         for v in INV_PIO4])
    return table


def _reduce_pio2(d: _Ops64, a32: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(r, q): |x| = q * pi/2 + r with |r| <= pi/4 (a little more on the fast path), q in 0..3,
    for a32 = |x| as float32 (finite). Cody-Waite below 2^20, glibc's 2/pi-bits product above."""
    b = d.b
    a = b.fpext(a32, F64)
    n, ni = d.round_int(d.mul(a, d.c(INV_PIO2)))
    r_fast = d.fma(n, d.c(-PIO2_LO), d.fma(n, d.c(-PIO2_HI), a))
    # Large: the 24-bit mantissa times the 2/pi bits that matter at this exponent, in 64-bit
    # fixed point with 62 fraction bits (glibc sysdeps/ieee754/flt-32/s_sincosf.h, reduce_large).
    xi = b.bitcast(a32, I32)
    table = _inv_pio4_table(d.module)
    index = b.and_(b.lshr(xi, I32(26)), I32(15))
    shift = b.and_(b.lshr(xi, I32(23)), I32(7))
    mant = b.shl(b.or_(b.and_(xi, I32(0xFFFFFF)), I32(0x800000)), shift)

    def entry(offset: int) -> ir.Value:
        return b.load(b.gep(table, [I32(0), b.add(index, I32(offset))], inbounds=True))

    m64 = b.zext(mant, I64)
    res0 = b.zext(b.mul(mant, entry(0)), I64)
    res1 = b.mul(m64, b.zext(entry(4), I64))
    res2 = b.mul(m64, b.zext(entry(8), I64))
    res0 = b.add(b.or_(b.lshr(res2, d.ci(32)), b.shl(res0, d.ci(32))), res1)
    q_large = b.lshr(b.add(res0, d.ci(1 << 61)), d.ci(62))
    frac = b.sub(res0, b.shl(q_large, d.ci(62)))
    r_large = d.mul(b.sitofp(frac, F64), d.c(PI63))
    fast = b.fcmp_ordered("<", a32, ir.Constant(F32, TRIG_FAST_LIMIT))
    r = d.select(fast, r_fast, r_large)
    q = b.and_(b.select(fast, ni, q_large), d.ci(3))
    return r, q


def _with_sign_of(m: _Ops, x: ir.Value, y: ir.Value) -> ir.Value:
    """float32 y with its sign flipped where x's sign bit is set (odd functions; f(-0) = -0)."""
    flip = m.b.and_(m.bits(x), m.ci(-(1 << 31)))
    return m.from_bits(m.b.xor(m.bits(y), flip))


def _finite_or_nan(m: _Ops, x: ir.Value, y: ir.Value) -> ir.Value:
    """y where x is finite, NaN where x is +-inf or NaN (x - x)."""
    return m.select(m.cmp("<", m.fabs(x), m.c(INF)), y, m.sub(x, x))


def _sin_cos_tan(m: _Ops, x: ir.Value, which: str) -> ir.Value:
    d = _Ops64(m.b)
    b = m.b
    r, q = _reduce_pio2(d, m.fabs(x))
    s = d.odd(r, SIN_POLY)
    c = d.fma(d.mul(r, r), d.horner(d.mul(r, r), COS_POLY), d.c(1.0))
    odd_q = b.icmp_unsigned("!=", b.and_(q, d.ci(1)), d.ci(0))
    if which == "tan":
        value = d.select(odd_q, d.neg(d.div(c, s)), d.div(s, c))
        return _finite_or_nan(m, x, _with_sign_of(m, x, b.fptrunc(value, F32)))
    if which == "sin":
        value = d.select(odd_q, c, s)
        negate = b.and_(q, d.ci(2))
    else:
        value = d.select(odd_q, s, c)
        negate = b.and_(b.add(q, d.ci(1)), d.ci(2))
    value = d.select(b.icmp_unsigned("!=", negate, d.ci(0)), d.neg(value), value)
    y = b.fptrunc(value, F32)
    if which == "sin":
        y = _with_sign_of(m, x, y)
    return _finite_or_nan(m, x, y)


def _emit_sin(m: _Ops, x: ir.Value) -> ir.Value:
    return _sin_cos_tan(m, x, "sin")


def _emit_cos(m: _Ops, x: ir.Value) -> ir.Value:
    return _sin_cos_tan(m, x, "cos")


def _emit_tan(m: _Ops, x: ir.Value) -> ir.Value:
    return _sin_cos_tan(m, x, "tan")


def _asin_parts(d: _Ops64, a: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(asin(a) for a <= 1/2, asin(s) with s = sqrt((1 - a) / 2), a > 1/2 mask) for a = |x|."""
    small = d.odd(a, ASIN_POLY)
    s = d.sqrt(d.mul(d.sub(d.c(1.0), a), d.c(0.5)))
    return small, d.odd(s, ASIN_POLY), d.cmp(">", a, d.c(0.5))


def _emit_asin(m: _Ops, x: ir.Value) -> ir.Value:
    d = _Ops64(m.b)
    a = d.fabs(m.b.fpext(x, F64))
    small, half, big = _asin_parts(d, a)
    value = d.select(big, d.fma(half, d.c(-2.0), d.c(PIO2_64)), small)
    y = _with_sign_of(m, x, m.b.fptrunc(value, F32))
    return m.select(m.cmp("<=", m.fabs(x), m.c(1.0)), y, m.c(NAN))


def _emit_acos(m: _Ops, x: ir.Value) -> ir.Value:
    d = _Ops64(m.b)
    xd = m.b.fpext(x, F64)
    small, half, big = _asin_parts(d, d.fabs(xd))
    signed_small = d.select(d.cmp("<", xd, d.c(0.0)), d.neg(small), small)
    twice = d.add(half, half)
    large = d.select(d.cmp("<", xd, d.c(0.0)), d.sub(d.c(PI64), twice), twice)
    value = d.select(big, large, d.sub(d.c(PIO2_64), signed_small))
    return m.select(m.cmp("<=", m.fabs(x), m.c(1.0)), m.b.fptrunc(value, F32), m.c(NAN))


def _emit_atan(m: _Ops, x: ir.Value) -> ir.Value:
    d = _Ops64(m.b)
    a = d.fabs(m.b.fpext(x, F64))
    inverted = d.cmp(">", a, d.c(1.0))
    t = d.select(inverted, d.div(d.c(1.0), a), a)  # t in [0, 1]
    shifted = d.cmp(">", t, d.c(ATAN_SPLIT))
    u = d.select(shifted, d.div(d.fma(t, d.c(SQRT3), d.c(-1.0)), d.add(t, d.c(SQRT3))), t)
    v = d.odd(u, ATAN_POLY)
    v = d.select(shifted, d.add(v, d.c(PIO6_64)), v)
    v = d.select(inverted, d.sub(d.c(PIO2_64), v), v)
    y = _with_sign_of(m, x, m.b.fptrunc(v, F32))
    return m.select(m.is_nan(x), x, y)


def _emit_sinh(m: _Ops, x: ir.Value) -> ir.Value:
    d = _Ops64(m.b)
    a = d.fabs(m.b.fpext(x, F64))
    e = d.exp(d.select(d.cmp("<", a, d.c(200.0)), a, d.c(200.0)))
    large = d.mul(d.sub(e, d.div(d.c(1.0), e)), d.c(0.5))
    value = d.select(d.cmp("<", a, d.c(1.0)), d.odd(a, SINH_POLY), large)
    y = _with_sign_of(m, x, m.b.fptrunc(value, F32))
    return m.select(m.is_nan(x), x, y)


def _emit_cosh(m: _Ops, x: ir.Value) -> ir.Value:
    d = _Ops64(m.b)
    a = d.fabs(m.b.fpext(x, F64))
    e = d.exp(d.select(d.cmp("<", a, d.c(200.0)), a, d.c(200.0)))
    value = d.mul(d.add(e, d.div(d.c(1.0), e)), d.c(0.5))
    return m.select(m.is_nan(x), x, m.b.fptrunc(value, F32))


def _emit_asinh(m: _Ops, x: ir.Value) -> ir.Value:
    # asinh(a) = log1p(a + a^2 / (1 + sqrt(1 + a^2))); a^2 cannot overflow a double.
    d = _Ops64(m.b)
    a = d.fabs(m.b.fpext(x, F64))
    a2 = d.mul(a, a)
    u = d.add(a, d.div(a2, d.add(d.c(1.0), d.sqrt(d.add(a2, d.c(1.0))))))
    y = _with_sign_of(m, x, m.b.fptrunc(d.log1p(u), F32))
    y = m.select(m.cmp("==", m.fabs(x), m.c(INF)), x, y)
    return m.select(m.is_nan(x), x, y)


def _emit_acosh(m: _Ops, x: ir.Value) -> ir.Value:
    # acosh(x) = log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact in double).
    d = _Ops64(m.b)
    t = d.sub(m.b.fpext(x, F64), d.c(1.0))
    u = d.add(t, d.sqrt(d.mul(t, d.add(t, d.c(2.0)))))
    y = m.b.fptrunc(d.log1p(u), F32)
    y = m.select(m.cmp("==", x, m.c(INF)), x, y)
    return m.select(m.cmp_u("<", x, m.c(1.0)), m.c(NAN), y)


def _emit_atanh(m: _Ops, x: ir.Value) -> ir.Value:
    # atanh(a) = log1p(2a / (1 - a)) / 2; 1 - a is exact in double.
    d = _Ops64(m.b)
    a = d.fabs(m.b.fpext(x, F64))
    below_one = d.cmp("<", a, d.c(1.0))
    u = d.div(d.add(a, a), d.sub(d.c(1.0), d.select(below_one, a, d.c(0.0))))
    y = _with_sign_of(m, x, m.b.fptrunc(d.mul(d.log1p(u), d.c(0.5)), F32))
    y = m.select(m.cmp("==", m.fabs(x), m.c(1.0)), _with_sign_of(m, x, m.c(INF)), y)
    return m.select(m.cmp_u(">", m.fabs(x), m.c(1.0)), m.c(NAN), y)


_EMITTERS: dict[str, Callable[[_Ops, ir.Value], ir.Value]] = {
    "exp": _emit_exp,
    "log": _emit_log,
    "tanh": _emit_tanh,
    "sigmoid": _emit_sigmoid,
    "erf": _emit_erf,
    "sqrt": _emit_sqrt,
    "sin": _emit_sin,
    "cos": _emit_cos,
    "tan": _emit_tan,
    "asin": _emit_asin,
    "acos": _emit_acos,
    "atan": _emit_atan,
    "sinh": _emit_sinh,
    "cosh": _emit_cosh,
    "asinh": _emit_asinh,
    "acosh": _emit_acosh,
    "atanh": _emit_atanh,
}

SUPPORTED: frozenset[str] = frozenset(_EMITTERS)


def math_function(module: ir.Module, name: str) -> ir.Function:
    """Return ``float @"mlc.math.<name>"(float)`` in ``module``, defining it on first use.

    The function is internal and ``alwaysinline``; name is one of ``SUPPORTED``.
    Raises ValueError for an unknown name.
    """
    if name not in _EMITTERS:
        raise ValueError(
            f"no vector math function {name!r}; supported: {', '.join(sorted(SUPPORTED))}"
        )
    symbol = f"{SYMBOL_PREFIX}{name}"
    existing = module.globals.get(symbol)
    if existing is not None:
        return existing
    fn = ir.Function(module, ir.FunctionType(F32, [F32]), name=symbol)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(_EMITTERS[name](_Ops(builder), fn.args[0]))
    return fn


def call_math(builder: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    """Emit a call of ``mlc.math.<name>`` on ``x`` at the builder's position and return the float32 result."""
    return builder.call(math_function(builder.module, name), [x])
