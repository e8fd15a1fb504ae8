//! The timing every benchmark of typed-amp's workspace shares (the root crate's `benches/`,
//! `cli/benches/`, `kernels/benches/`; plain binaries with `harness = false`): one definition of
//! a median, a quantile and a timed loop, so that figures from different benches are computed the
//! same way.
//!
//! A dev-dependency of the crates with benches, and of nothing else.

use std::time::{Duration, Instant};

/// The median of `values`: the middle one, or the mean of the two middle ones of an even count.
/// Panics on an empty slice (a bench that timed nothing has nothing to report).
pub fn median(values: &[f64]) -> f64 {
    let sorted = sorted(values);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// The `q`-quantile of `values` (`0.0` the least, `1.0` the greatest), the sample nearest to
/// rank `q · (n − 1)`. Panics on an empty slice.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let sorted = sorted(values);
    sorted[((sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
}

/// The least of `values`. Panics on an empty slice.
pub fn minimum(values: &[f64]) -> f64 {
    quantile(values, 0.0)
}

/// The median of `samples` in milliseconds ([`median`]).
pub fn median_ms(samples: &[Duration]) -> f64 {
    median(&ms(samples))
}

/// The least of `samples` in milliseconds.
pub fn min_ms(samples: &[Duration]) -> f64 {
    minimum(&ms(samples))
}

fn ms(samples: &[Duration]) -> Vec<f64> {
    samples.iter().map(|t| t.as_secs_f64() * 1e3).collect()
}

fn sorted(values: &[f64]) -> Vec<f64> {
    assert!(!values.is_empty(), "no samples");
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// Timed samples of one operation, in the order they were taken.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    times: Vec<Duration>,
    total: Duration,
}

impl Samples {
    /// No samples yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one sample.
    pub fn push(&mut self, t: Duration) {
        self.times.push(t);
        self.total += t;
    }

    /// Times `f` once and adds the sample; returns what `f` returned.
    pub fn time<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.push(start.elapsed());
        r
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.times.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    /// Their sum.
    pub fn total(&self) -> Duration {
        self.total
    }

    /// The samples, in the order they were taken.
    pub fn times(&self) -> &[Duration] {
        &self.times
    }

    /// The median sample in milliseconds ([`median`]).
    pub fn median_ms(&self) -> f64 {
        median_ms(&self.times)
    }

    /// The `q`-quantile in milliseconds ([`quantile`]).
    pub fn quantile_ms(&self, q: f64) -> f64 {
        quantile(&ms(&self.times), q)
    }

    /// The least sample in milliseconds.
    pub fn min_ms(&self) -> f64 {
        min_ms(&self.times)
    }

    /// The mean in milliseconds.
    pub fn mean_ms(&self) -> f64 {
        self.total.as_secs_f64() * 1e3 / self.times.len() as f64
    }
}

impl FromIterator<Duration> for Samples {
    fn from_iter<I: IntoIterator<Item = Duration>>(iter: I) -> Self {
        let mut s = Samples::new();
        for t in iter {
            s.push(t);
        }
        s
    }
}

/// Median seconds per call of `f`: three calls to warm up, then 9 samples, each of as many calls
/// as fill about 20 ms (so that a call far shorter than the clock's resolution is still timed).
pub fn seconds_per_call(mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let t = Instant::now();
    f();
    let one = t.elapsed().max(Duration::from_nanos(100));
    let iters = (Duration::from_millis(20).as_secs_f64() / one.as_secs_f64()).ceil() as usize;
    let samples: Vec<f64> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    median(&samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_quantiles_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(quantile(&[5.0, 1.0, 4.0, 2.0, 3.0], 0.25), 2.0);
        assert_eq!(quantile(&[5.0, 1.0, 4.0, 2.0, 3.0], 1.0), 5.0);
        assert_eq!(minimum(&[5.0, 1.0, 4.0]), 1.0);
    }

    #[test]
    fn samples_keep_their_sum_and_order() {
        let s: Samples = [3, 1, 2].into_iter().map(Duration::from_millis).collect();
        assert_eq!(s.total(), Duration::from_millis(6));
        assert_eq!(s.times()[0], Duration::from_millis(3));
        assert_eq!(s.median_ms(), 2.0);
        assert_eq!(s.min_ms(), 1.0);
        assert_eq!(s.mean_ms(), 2.0);
    }
}
