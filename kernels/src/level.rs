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
    Avx512Bf16,
}

impl Level {
    /// All levels, lowest first.
    pub const ALL: [Level; 4] = [
        Level::Portable,
        Level::Avx2,
        Level::Avx512,
        Level::Avx512Bf16,
    ];

    /// The name accepted by `TYPED_AMP_KERNELS`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Avx512Bf16 => "avx512bf16",
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
    if is_x86_feature_detected!("avx512bf16") {
        Level::Avx512Bf16
    } else {
        Level::Avx512
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Level {
    Level::Portable
}

/// `detected_level()` capped by `TYPED_AMP_KERNELS`, read once.
fn env_level() -> Level {
    static ENV: OnceLock<Level> = OnceLock::new();
    *ENV.get_or_init(|| {
        let detected = detected_level();
        match std::env::var("TYPED_AMP_KERNELS") {
            Ok(v) => match Level::from_name(&v) {
                Some(cap) => cap.min(detected),
                // An unknown value must not silently run code the user tried to rule out.
                None => Level::Portable,
            },
            Err(_) => detected,
        }
    })
}

const NOT_FORCED: u8 = u8::MAX;
static FORCED: AtomicU8 = AtomicU8::new(NOT_FORCED);

/// The level the kernels use now: the detected level, capped by `TYPED_AMP_KERNELS` or by
/// [`force_level`].
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
