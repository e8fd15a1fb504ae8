//! Run-time choice of instruction set.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// An instruction-set level; each one includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Plain Rust, left to the compiler's auto-vectoriser for the build target. Every CPU.
    Portable,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// x86-64 with AVX-512F, BW and VL (and AVX2, FMA, F16C).
    Avx512,
    /// [`Level::Avx512`] plus AVX512-BF16: bf16 products use `vdpbf16ps` on bf16 pairs.
    ///
    /// Used by default only where that instruction outpaces widening bf16 to f32 (see
    /// [`default_level`]); [`force_level`] or `TYPED_AMP_KERNELS=avx512bf16` select it anywhere
    /// the CPU has it.
    Avx512Bf16,
    /// [`Level::Avx512Bf16`] plus Intel's AMX-TILE and AMX-BF16, with the operating system's
    /// leave to use the tile registers (on Linux, `arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked
    /// once by [`detected_level`]): bf16 products run on `tdpbf16ps`, 16 × 16 × 32
    /// multiply-adds an instruction. Every other kernel runs as at [`Level::Avx512`].
    AmxBf16,
}

impl Level {
    /// All levels, lowest first.
    pub const ALL: [Level; 5] = [
        Level::Portable,
        Level::Avx2,
        Level::Avx512,
        Level::Avx512Bf16,
        Level::AmxBf16,
    ];

    /// The name accepted by `TYPED_AMP_KERNELS`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Avx512Bf16 => "avx512bf16",
            Level::AmxBf16 => "amx",
        }
    }

    fn from_name(s: &str) -> Option<Level> {
        Level::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s.trim()))
    }

    fn from_u8(v: u8) -> Level {
        Level::ALL[v as usize]
    }
}

/// The highest level this CPU supports, whatever the caps.
pub fn detected_level() -> Level {
    static DETECTED: OnceLock<Level> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Level {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    if !avx2 {
        return Level::Portable;
    }
    // BW and VL (16-bit masked loads and stores) come with AVX-512F on every CPU since
    // Skylake-SP; requiring them keeps one AVX-512 path.
    if !(is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl"))
    {
        return Level::Avx2;
    }
    if !is_x86_feature_detected!("avx512bf16") {
        return Level::Avx512;
    }
    if amx_bf16_usable() {
        Level::AmxBf16
    } else {
        Level::Avx512Bf16
    }
}

/// Whether the CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22) and the
/// kernel lets this process use the tile data (Linux 5.16 and later grant it on request; a
/// tile instruction without that leave faults). Asked once: the leave is process-wide.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_bf16_usable() -> bool {
    const AMX_BF16: u32 = 1 << 22;
    const AMX_TILE: u32 = 1 << 24;
    // CPUID leaf 7 exists on every CPU with AVX-512 (checked by the caller).
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf7.edx & (AMX_BF16 | AMX_TILE) != AMX_BF16 | AMX_TILE {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;
    // SAFETY: arch_prctl with these arguments only asks for a permission; it touches no memory
    // of ours and fails cleanly (EINVAL) on kernels that do not know it.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// Other systems: AMX is left unused (each has its own way of granting the tile state).
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn amx_bf16_usable() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Level {
    Level::Portable
}

/// The level used when nothing is forced: [`detected_level`], except that AVX512-BF16 (without
/// AMX) is left out where its `vdpbf16ps` is slower than widening bf16 to f32 for FMA.
///
/// The pair kernel pays only where `vdpbf16ps` (32 multiply-adds) retires at least half as
/// often as `vfmadd231ps` (16). On AMD's Zen 4 and Zen 5 it does (on a Zen 5 the bf16 product
/// reached 1.8× the f32 one). On Intel's AVX512-BF16 parts it does not: on an Emerald Rapids
/// Xeon, 12 independent accumulator chains retire `vdpbf16ps` zmm at 0.67 ns and
/// `vfmadd231ps` zmm at 0.16 ns (96 against 200 GFLOP/s per core), and the pair kernel's bf16
/// product ran at 0.57× the widening kernel's (162 against 282 GFLOP/s at 1024³, 2 cores). The
/// choice is by vendor, not by timing, so that one machine always rounds the same way (the
/// two kernels sum a pair's products in different orders). Where the CPU has AMX (Intel's
/// Sapphire Rapids and later), bf16 products run on the tiles instead, at several times the
/// widening kernel's rate, and that level is the default.
pub fn default_level() -> Level {
    static DEFAULT: OnceLock<Level> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        let detected = detected_level();
        if detected == Level::Avx512Bf16 && !bf16_pairs_outpace_widening() {
            Level::Avx512
        } else {
            detected
        }
    })
}

/// Whether this CPU's `vdpbf16ps` is known to beat widening to f32 (AMD's, see
/// [`default_level`]).
#[cfg(target_arch = "x86_64")]
fn bf16_pairs_outpace_widening() -> bool {
    let leaf0 = std::arch::x86_64::__cpuid(0);
    // The vendor string is EBX, EDX, ECX: "AuthenticAMD".
    leaf0.ebx == u32::from_le_bytes(*b"Auth")
        && leaf0.edx == u32::from_le_bytes(*b"enti")
        && leaf0.ecx == u32::from_le_bytes(*b"cAMD")
}

#[cfg(not(target_arch = "x86_64"))]
fn bf16_pairs_outpace_widening() -> bool {
    false
}

/// [`default_level`], or `TYPED_AMP_KERNELS`'s level clamped to [`detected_level`], read once.
fn env_level() -> Level {
    static ENV: OnceLock<Level> = OnceLock::new();
    *ENV.get_or_init(|| match std::env::var("TYPED_AMP_KERNELS") {
        Ok(v) => match Level::from_name(&v) {
            Some(cap) => cap.min(detected_level()),
            // An unknown value must not silently run code the user tried to rule out.
            None => Level::Portable,
        },
        Err(_) => default_level(),
    })
}

const NOT_FORCED: u8 = u8::MAX;
static FORCED: AtomicU8 = AtomicU8::new(NOT_FORCED);

/// The level the kernels use now: [`default_level`], or the level named by `TYPED_AMP_KERNELS`
/// or [`force_level`] (never above [`detected_level`]).
#[inline]
pub fn level() -> Level {
    match FORCED.load(Ordering::Relaxed) {
        NOT_FORCED => env_level(),
        v => Level::from_u8(v),
    }
}

/// Forces the kernels to `Some(level)`, clamped to what the CPU supports (so a level the CPU
/// lacks is never selected), or back to the default with `None`. Replaces the
/// `TYPED_AMP_KERNELS` cap while forced. Process-wide; returns the level now in use.
pub fn force_level(forced: Option<Level>) -> Level {
    match forced {
        Some(l) => FORCED.store(l.min(detected_level()) as u8, Ordering::Relaxed),
        None => FORCED.store(NOT_FORCED, Ordering::Relaxed),
    }
    level()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_never_exceeds_the_cpu_and_drops_bf16_pairs_only_off_amd() {
        let default = default_level();
        assert!(default <= detected_level());
        let amd = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("vendor_id"))
                    .map(|l| l.contains("AuthenticAMD"))
            });
        if let Some(amd) = amd {
            assert_eq!(bf16_pairs_outpace_widening(), amd);
        }
        match detected_level() {
            Level::Avx512Bf16 if !bf16_pairs_outpace_widening() => {
                assert_eq!(default, Level::Avx512)
            }
            // AMX is used wherever it is detected (its permission granted), on any vendor.
            detected => assert_eq!(default, detected),
        }
    }
}
