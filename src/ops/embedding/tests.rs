//! The fused embedding against an f64 reference and against the composed ops.
//!
//! # Tolerances
//!
//! The tables hold values of `E`, so the reference sees what the kernels see. A forward element
//! is one f32 sum of two such values rounded once to `E`: `|ŷ − y| ≤ (u₃₂ + u)·|y| + η` (`u` the
//! unit roundoff of `E`, `η` half its smallest subnormal). A table row's gradient is an f32 sum
//! of the `n` rows that use it (`n` the token's count, or the batch for a position), each term
//! exact: `|ĝ − g| ≤ n·u₃₂·Σ|dy|`; adding it to a gradient already there is one more rounding.

use dfdx::prelude::*;

use super::{try_embed, try_embed_composed, EmbeddingDims, EmbeddingKernel};
use crate::precision::{dtype_of, AmpElem, DType};
use crate::tape::TraceMixed;

const U32: f64 = 1.0 / 16_777_216.0;
const V: usize = 11;
const P: usize = 9;
const C: usize = 20;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    fn values<E: AmpElem>(&mut self, n: usize) -> Vec<E> {
        (0..n)
            .map(|_| <E as AmpElem>::from_f32((self.next() * 4.0 - 2.0) as f32))
            .collect()
    }
}

fn f64s<E: AmpElem>(v: &[E]) -> Vec<f64> {
    v.iter().map(|x| f64::from(AmpElem::to_f32(*x))).collect()
}

fn eta<E: AmpElem>() -> f64 {
    match dtype_of::<E>() {
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        _ => 2f64.powi(-150),
    }
}

fn check_close(what: &str, got: &[f64], want: &[f64], bound: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= bound(i),
            "{what}[{i}]: {g} against {w} (bound {})",
            bound(i)
        );
    }
}

/// Forward and the tables' gradients (`loss = Σ y·dy`) of the fused op or the composed one.
fn run<E: AmpElem>(
    tokens: &[usize],
    (b, s): (usize, usize),
    wte: &[E],
    wpe: &[E],
    dy: &[E],
    fused: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>)
where
    Cpu: crate::device::Kernels<E>,
{
    let dev = Cpu::default();
    let ids: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(tokens.to_vec(), (b, s));
    let wte_t: Tensor<(Const<V>, Const<C>), E, Cpu> =
        dev.tensor_from_vec(wte.to_vec(), (Const, Const));
    let wpe_t: Tensor<(Const<P>, Const<C>), E, Cpu> =
        dev.tensor_from_vec(wpe.to_vec(), (Const, Const));
    let dy_t: Tensor<(usize, usize, Const<C>), E, Cpu> =
        dev.tensor_from_vec(dy.to_vec(), (b, s, Const));
    let traced = ids.leaky_traced_mixed();
    let y = if fused {
        try_embed(traced, &wte_t, &wpe_t).unwrap()
    } else {
        try_embed_composed(traced, &wte_t, &wpe_t).unwrap()
    };
    let values = f64s(&y.retaped::<NoneTape>().as_vec());
    let loss = crate::loss::Loss::new(crate::ops::cast::Cast::to_f32(y * dy_t).sum());
    let grads = loss.backward().unwrap().grads().clone();
    (
        values,
        f64s(&grads.get(&wte_t).unwrap().as_vec()),
        f64s(&grads.get(&wpe_t).unwrap().as_vec()),
    )
}

fn against_reference<E: AmpElem>()
where
    Cpu: crate::device::Kernels<E>,
{
    let mut rng = Lcg(4);
    for (b, s) in [(1, 1), (3, 7), (5, P)] {
        let tokens: Vec<usize> = (0..b * s).map(|i| (i * i + 3 * i) % V).collect();
        let (wte, wpe, dy) = (
            rng.values::<E>(V * C),
            rng.values::<E>(P * C),
            rng.values::<E>(b * s * C),
        );
        let (wte64, wpe64, dy64) = (f64s(&wte), f64s(&wpe), f64s(&dy));
        let mut y = vec![0.0; b * s * C];
        let (mut gte, mut gpe) = (vec![0.0; V * C], vec![0.0; P * C]);
        let (mut ate, mut ape) = (vec![0.0; V * C], vec![0.0; P * C]);
        let (mut nte, mut npe) = (vec![0usize; V], vec![0usize; P]);
        for (r, &t) in tokens.iter().enumerate() {
            let pos = r % s;
            nte[t] += 1;
            npe[pos] += 1;
            for c in 0..C {
                y[r * C + c] = wte64[t * C + c] + wpe64[pos * C + c];
                gte[t * C + c] += dy64[r * C + c];
                ate[t * C + c] += dy64[r * C + c].abs();
                gpe[pos * C + c] += dy64[r * C + c];
                ape[pos * C + c] += dy64[r * C + c].abs();
            }
        }
        let u = f64::from(dtype_of::<E>().unit_roundoff());
        let (yf, gtf, gpf) = run(&tokens, (b, s), &wte, &wpe, &dy, true);
        check_close("y", &yf, &y, |i| (U32 + u) * y[i].abs() + eta::<E>());
        // The fused op's gradients are FP32, read back through the parameters' precision by
        // `grads.get`: one rounding to E more.
        check_close("dwte", &gtf, &gte, |i| {
            nte[i / C] as f64 * U32 * ate[i] + u * gte[i].abs() + eta::<E>()
        });
        check_close("dwpe", &gpf, &gpe, |i| {
            npe[i / C] as f64 * U32 * ape[i] + u * gpe[i].abs() + eta::<E>()
        });
        // The composed ops sum in E (their gather and broadcast backwards), so each of the n
        // terms may be rounded to E.
        let (yc, gtc, gpc) = run(&tokens, (b, s), &wte, &wpe, &dy, false);
        check_close("composed y", &yc, &y, |i| {
            (U32 + u) * y[i].abs() + eta::<E>()
        });
        check_close("composed dwte", &gtc, &gte, |i| {
            (nte[i / C] + 1) as f64 * u * ate[i] + eta::<E>() * nte[i / C] as f64
        });
        check_close("composed dwpe", &gpc, &gpe, |i| {
            (npe[i / C] + 1) as f64 * u * ape[i] + eta::<E>() * npe[i / C] as f64
        });
    }
}

#[test]
fn the_fused_embedding_matches_the_f64_reference_and_the_composed_ops() {
    against_reference::<f32>();
    against_reference::<half::f16>();
    against_reference::<half::bf16>();
}

#[test]
fn the_backward_adds_to_an_existing_gradient_or_writes_a_fresh_one() {
    let dev = Cpu::default();
    let d = EmbeddingDims {
        batch: 2,
        tokens: 3,
        width: 2,
        vocab: 4,
        positions: 3,
    };
    let ids: Tensor<(usize,), usize, Cpu> = dev.tensor_from_vec(vec![0, 1, 1, 3, 1, 0], (6,));
    let dy: Tensor<(usize,), f32, Cpu> =
        dev.tensor_from_vec((1..=12).map(|x| x as f32).collect(), (12,));
    let mut g: Tensor<(usize,), f32, Cpu> = dev.tensor_from_vec(vec![100.0; 8], (8,));
    EmbeddingKernel::<f32>::try_embed_backward(
        &dev,
        d,
        ids.storage(),
        dy.storage(),
        Some((g.storage_mut(), false)),
        None,
    )
    .unwrap();
    // Token 0: rows 0 and 5 (dy 1,2 and 11,12); token 1: rows 1, 2, 4; token 3: row 3.
    assert_eq!(
        g.as_vec(),
        vec![112.0, 114.0, 117.0, 120.0, 100.0, 100.0, 107.0, 108.0]
    );
    EmbeddingKernel::<f32>::try_embed_backward(
        &dev,
        d,
        ids.storage(),
        dy.storage(),
        Some((g.storage_mut(), true)),
        None,
    )
    .unwrap();
    assert_eq!(g.as_vec(), vec![12.0, 14.0, 17.0, 20.0, 0.0, 0.0, 7.0, 8.0]);
    let mut p: Tensor<(usize,), f32, Cpu> = dev.zeros_like(&(6,));
    EmbeddingKernel::<f32>::try_embed_backward(
        &dev,
        d,
        ids.storage(),
        dy.storage(),
        None,
        Some((p.storage_mut(), true)),
    )
    .unwrap();
    assert_eq!(p.as_vec(), vec![8.0, 10.0, 12.0, 14.0, 16.0, 18.0]);
}

#[test]
fn ids_outside_the_vocabulary_and_too_many_tokens_are_errors() {
    let dev = Cpu::default();
    let wte: Tensor<(Const<V>, Const<C>), f32, Cpu> = dev.zeros();
    let wpe: Tensor<(Const<P>, Const<C>), f32, Cpu> = dev.zeros();
    let bad: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(vec![0, V], (1, 2));
    assert!(try_embed(bad.clone().leaky_traced_mixed(), &wte, &wpe).is_err());
    assert!(try_embed_composed(bad.leaky_traced_mixed(), &wte, &wpe).is_err());
    let long: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(vec![0; P + 1], (1, P + 1));
    assert!(try_embed(long.clone().leaky_traced_mixed(), &wte, &wpe).is_err());
    assert!(try_embed_composed(long.leaky_traced_mixed(), &wte, &wpe).is_err());
}
