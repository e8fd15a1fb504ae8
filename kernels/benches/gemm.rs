//! GFLOP/s of `typed_amp_kernels::gemm` against gemm 0.19 (the maintained crate) and gemm 0.15.5
//! (what dfdx 0.13 called before), on the training step's shapes. A plain binary rather than
//! criterion: it prints one table, medians of repeated timings.
//!
//! `cargo bench -p typed-amp-kernels --bench gemm [-- FILTER]`; `TYPED_AMP_KERNELS` applies.

use bench_timing::seconds_per_call as time;
use half::{bf16, f16};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rayon::prelude::*;
use typed_amp_kernels::{Activation, Epilogue, GemmElem};

#[derive(Clone, Copy)]
enum L {
    Row,
    Col,
}

struct Shape {
    name: &'static str,
    m: usize,
    n: usize,
    k: usize,
    a: L,
    b: L,
    c: L,
    accumulate: bool,
}

#[allow(clippy::too_many_arguments)]
const fn s(
    name: &'static str,
    m: usize,
    n: usize,
    k: usize,
    a: L,
    b: L,
    c: L,
    accumulate: bool,
) -> Shape {
    Shape {
        name,
        m,
        n,
        k,
        a,
        b,
        c,
        accumulate,
    }
}

// The MLP 784-512-512-10 at batch 256 as dfdx computes it: forward x·Wᵀ (W stored [out, in],
// so B is column-major); grad_x = g·W accumulated; grad_Wᵀ = xᵀ·g accumulated into the
// column-major view of grad_W. CNN: one image's im2col product per call.
const SHAPES: &[Shape] = &[
    s("square 256", 256, 256, 256, L::Row, L::Row, L::Row, false),
    s(
        "square 1024",
        1024,
        1024,
        1024,
        L::Row,
        L::Row,
        L::Row,
        false,
    ),
    s(
        "mlp fwd1 x·W1ᵀ",
        256,
        512,
        784,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s(
        "mlp fwd2 x·W2ᵀ",
        256,
        512,
        512,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s(
        "mlp fwd3 x·W3ᵀ",
        256,
        10,
        512,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s("mlp gx1 g·W1", 256, 784, 512, L::Row, L::Row, L::Row, true),
    s("mlp gx2 g·W2", 256, 512, 512, L::Row, L::Row, L::Row, true),
    s("mlp gx3 g·W3", 256, 512, 10, L::Row, L::Row, L::Row, true),
    s("mlp gW1ᵀ xᵀ·g", 784, 512, 256, L::Col, L::Row, L::Col, true),
    s("mlp gW2ᵀ xᵀ·g", 512, 512, 256, L::Col, L::Row, L::Col, true),
    s("mlp gW3ᵀ xᵀ·g", 512, 10, 256, L::Col, L::Row, L::Col, true),
    // The ViT (batch 128, 17 tokens, width 64, MLP 128): a linear layer's three products over
    // 2176 token rows, and one head's attention products (128 × 4 of them per step).
    s(
        "vit fc1 x·W1ᵀ",
        2176,
        128,
        64,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s(
        "vit fc2 x·W2ᵀ",
        2176,
        64,
        128,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s("vit gx1 g·W1", 2176, 64, 128, L::Row, L::Row, L::Row, true),
    s("vit gW1ᵀ xᵀ·g", 64, 128, 2176, L::Col, L::Row, L::Col, true),
    // The baby GPT (batch 64 × context 256 = 16384 token rows, width 384, MLP 1536): the
    // forward products of the attention's packed QKV, the MLP's two layers, an input gradient
    // and two weight gradients (each summed over all 16384 rows).
    s(
        "gpt qkv x·Wᵀ",
        16384,
        1152,
        384,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s(
        "gpt fc x·Wᵀ",
        16384,
        1536,
        384,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s(
        "gpt proj x·Wᵀ",
        16384,
        384,
        1536,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s("gpt gx g·W", 16384, 384, 1536, L::Row, L::Row, L::Row, true),
    s(
        "gpt gW fc gᵀ·x",
        1536,
        384,
        16384,
        L::Col,
        L::Row,
        L::Row,
        false,
    ),
    s(
        "gpt gW proj gᵀ·x",
        384,
        1536,
        16384,
        L::Col,
        L::Row,
        L::Row,
        false,
    ),
    s(
        "gpt gW qkv gᵀ·x",
        1152,
        384,
        16384,
        L::Col,
        L::Row,
        L::Row,
        false,
    ),
    s(
        "gpt gW attn gᵀ·x",
        384,
        384,
        16384,
        L::Col,
        L::Row,
        L::Row,
        false,
    ),
    // The small GPT (batch 12 × context 64 = 768 token rows, width 128, MLP 512): its forward
    // products, an input gradient and a weight gradient (summed over the 768 rows).
    s(
        "small qkv x·Wᵀ",
        768,
        384,
        128,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s(
        "small fc x·Wᵀ",
        768,
        512,
        128,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s(
        "small proj x·Wᵀ",
        768,
        128,
        512,
        L::Row,
        L::Col,
        L::Row,
        false,
    ),
    s("small gx g·W", 768, 128, 512, L::Row, L::Row, L::Row, true),
    s(
        "small gW fc gᵀ·x",
        512,
        128,
        768,
        L::Col,
        L::Row,
        L::Row,
        false,
    ),
    s(
        "small gW qkv gᵀ·x",
        384,
        128,
        768,
        L::Col,
        L::Row,
        L::Row,
        false,
    ),
    s("vit head q·kᵀ", 17, 17, 16, L::Row, L::Col, L::Row, false),
    // The baby GPT's attention, one (sample, head) and one 64-key block: `QKᵀ`, `PV`, and a
    // backward product with a transposed A (`dK = dSᵀ·Q`), 15,360 of each a step.
    s("gpt head q·kᵀ", 64, 64, 64, L::Row, L::Col, L::Row, false),
    s("gpt head p·v", 64, 64, 64, L::Row, L::Row, L::Row, false),
    s("gpt head dsᵀ·q", 64, 64, 64, L::Col, L::Row, L::Row, true),
    s("vit head p·v", 17, 16, 17, L::Row, L::Row, L::Row, false),
    s(
        "cnn conv1 im2col",
        16,
        784,
        9,
        L::Row,
        L::Row,
        L::Row,
        false,
    ),
    s(
        "cnn conv2 im2col",
        32,
        196,
        144,
        L::Row,
        L::Row,
        L::Row,
        false,
    ),
];

fn strides(l: L, rows: usize, cols: usize) -> (isize, isize) {
    match l {
        L::Row => (cols as isize, 1),
        L::Col => (1, rows as isize),
    }
}

struct Bufs<T> {
    a: Vec<T>,
    b: Vec<T>,
    c: Vec<T>,
}

fn bufs<T: Copy>(sh: &Shape, conv: impl Fn(f32) -> T) -> Bufs<T> {
    let mut rng = StdRng::seed_from_u64(1);
    let mut v = |len| {
        (0..len)
            .map(|_| conv(rng.gen_range(-1.0f32..1.0)))
            .collect::<Vec<T>>()
    };
    Bufs {
        a: v(sh.m * sh.k),
        b: v(sh.k * sh.n),
        c: v(sh.m * sh.n),
    }
}

fn ours<T: GemmElem>(sh: &Shape, x: &mut Bufs<T>, threads: usize) -> f64 {
    let (a_rs, a_cs) = strides(sh.a, sh.m, sh.k);
    let (b_rs, b_cs) = strides(sh.b, sh.k, sh.n);
    let (c_rs, c_cs) = strides(sh.c, sh.m, sh.n);
    time(|| unsafe {
        typed_amp_kernels::gemm(
            sh.m,
            sh.n,
            sh.k,
            x.a.as_ptr(),
            a_rs,
            a_cs,
            x.b.as_ptr(),
            b_rs,
            b_cs,
            x.c.as_mut_ptr(),
            c_rs,
            c_cs,
            sh.accumulate,
            threads,
        )
    })
}

macro_rules! gemm_crate {
    ($name:ident, $krate:ident, $par:expr) => {
        fn $name<T: 'static + Copy>(
            sh: &Shape,
            x: &mut Bufs<T>,
            one: T,
            zero: T,
            threads: usize,
        ) -> f64 {
            let (a_rs, a_cs) = strides(sh.a, sh.m, sh.k);
            let (b_rs, b_cs) = strides(sh.b, sh.k, sh.n);
            let (c_rs, c_cs) = strides(sh.c, sh.m, sh.n);
            time(|| unsafe {
                $krate::gemm(
                    sh.m,
                    sh.n,
                    sh.k,
                    x.c.as_mut_ptr(),
                    c_cs,
                    c_rs,
                    sh.accumulate,
                    x.a.as_ptr(),
                    a_cs,
                    a_rs,
                    x.b.as_ptr(),
                    b_cs,
                    b_rs,
                    if sh.accumulate { one } else { zero },
                    one,
                    false,
                    false,
                    false,
                    $par(threads),
                )
            })
        }
    };
}
gemm_crate!(gemm019, gemm, gemm::Parallelism::Rayon);
gemm_crate!(gemm015, gemm015, gemm015::Parallelism::Rayon);

fn gf(sh: &Shape, secs: f64) -> String {
    format!("{:7.1}", 2.0 * (sh.m * sh.n * sh.k) as f64 / secs / 1e9)
}

fn main() {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let threads = rayon::current_num_threads();
    println!(
        "level {:?} (detected {:?}), rayon threads {threads}; GFLOP/s, median of 9",
        typed_amp_kernels::level(),
        typed_amp_kernels::detected_level()
    );
    println!(
        "{:<20} {:>15} | {:>7} {:>7} {:>7} | {:>7} {:>7} {:>7} | {:>7}",
        "shape", "m×n×k", "f32", "g0.19", "g0.15", "f16", "g0.19", "g0.15", "bf16"
    );
    for sh in SHAPES {
        if filter.as_deref().is_some_and(|f| !sh.name.contains(f)) {
            continue;
        }
        let mut x = bufs(sh, |v| v);
        let (o32, g19, g15) = (
            ours(sh, &mut x, threads),
            gemm019(sh, &mut x, 1.0f32, 0.0, threads),
            gemm015(sh, &mut x, 1.0f32, 0.0, threads),
        );
        let mut h = bufs(sh, f16::from_f32);
        let (o16, h19, h15) = (
            ours(sh, &mut h, threads),
            gemm019(sh, &mut h, f16::ONE, f16::ZERO, threads),
            gemm015(sh, &mut h, f16::ONE, f16::ZERO, threads),
        );
        let mut bb = bufs(sh, bf16::from_f32);
        let ob = ours(sh, &mut bb, threads);
        println!(
            "{:<20} {:>15} | {} {} {} | {} {} {} | {}",
            sh.name,
            format!("{}×{}×{}", sh.m, sh.n, sh.k),
            gf(sh, o32),
            gf(sh, g19),
            gf(sh, g15),
            gf(sh, o16),
            gf(sh, h19),
            gf(sh, h15),
            gf(sh, ob)
        );
    }

    epilogue_rows(filter.as_deref(), threads);
    halves_rows(filter.as_deref(), threads);
    a_rows_rows(filter.as_deref(), threads);

    println!("\nrayon overhead: ours at 1 thread vs {threads} (f32, GFLOP/s and µs per call)");
    for sh in SHAPES.iter().filter(|s| s.m * s.n * s.k <= 256 * 512 * 512) {
        if filter.as_deref().is_some_and(|f| !sh.name.contains(f)) {
            continue;
        }
        let mut x = bufs(sh, |v| v);
        let t1 = ours(sh, &mut x, 1);
        let tn = ours(sh, &mut x, threads);
        println!(
            "{:<20} 1 thread {} ({:8.1} µs)   {threads} threads {} ({:8.1} µs)",
            sh.name,
            gf(sh, t1),
            t1 * 1e6,
            gf(sh, tn),
            tn * 1e6
        );
    }
    let fork = time(|| {
        (0..threads).into_par_iter().for_each(|i| {
            std::hint::black_box(i);
        })
    });
    println!(
        "empty rayon for_each over {threads} items from the main thread: {:.1} µs",
        fork * 1e6
    );
}

/// Weight gradients as typed-amp's linear layers compute them (`dW = dyᵀ·x` into the FP32
/// gradient: A column-major, B and C row-major, the plain epilogue), whole against split into
/// two halves of k (`k_pieces.rs`), for the shapes that take the halves: the ViT's four
/// (k = 2176 token rows), the small GPT's attention projection and the baby GPT's. The
/// operands stay in cache between the timed calls; in a training step they come from L3.
fn halves_rows(filter: Option<&str>, threads: usize) {
    // (name, m = outputs, n = inputs, k = token rows)
    const GRADS: [(&str, usize, usize, usize); 6] = [
        ("halves vit qkv", 192, 64, 2176),
        ("halves vit fc1", 128, 64, 2176),
        ("halves vit fc2", 64, 128, 2176),
        ("halves vit proj", 64, 64, 2176),
        ("halves small proj", 128, 128, 768),
        ("halves baby proj", 384, 384, 16384),
    ];
    println!("\nweight gradients into FP32: whole vs two halves of k (GFLOP/s)");
    println!(
        "{:<20} {:>15} | {:>7} {:>7} | {:>7} {:>7}",
        "shape", "m×n×k", "f32", "halves", "bf16", "halves"
    );
    fn timed<T: GemmElem>(sh: &Shape, x: &Bufs<T>, threads: usize, halves: bool) -> f64
    where
        f32: typed_amp_kernels::GemmOut<T>,
    {
        let mut c = vec![0f32; sh.m * sh.n];
        typed_amp_kernels::set_k_halves(halves);
        let secs = time(|| unsafe {
            typed_amp_kernels::gemm_epilogue::<T, f32>(
                sh.m,
                sh.n,
                sh.k,
                x.a.as_ptr(),
                1,
                sh.m as isize,
                x.b.as_ptr(),
                sh.n as isize,
                1,
                c.as_mut_ptr(),
                sh.n as isize,
                1,
                &Epilogue::STORE,
                threads,
            );
        });
        typed_amp_kernels::set_k_halves(true);
        secs
    }
    for (name, m, n, k) in GRADS {
        if filter.is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let sh = &s(name, m, n, k, L::Col, L::Row, L::Row, false);
        let (x32, x16) = (bufs(sh, |v| v), bufs(sh, bf16::from_f32));
        println!(
            "{:<20} {:>15} | {} {} | {} {}",
            sh.name,
            format!("{}×{}×{}", sh.m, sh.n, sh.k),
            gf(sh, timed(sh, &x32, threads, false)),
            gf(sh, timed(sh, &x32, threads, true)),
            gf(sh, timed(sh, &x16, threads, false)),
            gf(sh, timed(sh, &x16, threads, true)),
        );
    }
}

/// A row-major A read in place (as `Arch::a_rows` chooses: not where a tile's rows crowd one
/// L1 set, `gemm::arch::crowds_l1_set`) against packed (`set_a_rows_in_place(false)`), for row
/// lengths whose rows are 4 KiB apart (1024 f32, 2048 bf16: the rule packs them), 1.5 times that
/// (1536 f32: six rows to a set, read in place) and neither (1040). The two columns of a
/// crowded row length are the same path; the others show what reading in place gains.
fn a_rows_rows(filter: Option<&str>, threads: usize) {
    println!(
        "\nA's rows: read in place where the rule allows vs packed (1024 × 1024 × k, GFLOP/s)"
    );
    println!(
        "{:<20} {:>15} | {:>7} {:>7} | {:>7} {:>7}",
        "shape", "m×n×k", "f32", "packed", "bf16", "packed"
    );
    for k in [1024, 1040, 1536, 2048] {
        let name = format!("a rows k{k}");
        if filter.is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let sh = &s("a rows", 1024, 1024, k, L::Row, L::Row, L::Row, false);
        let (mut x32, mut x16) = (bufs(sh, |v| v), bufs(sh, bf16::from_f32));
        let mut both = |packed: bool| {
            typed_amp_kernels::set_a_rows_in_place(!packed);
            let t = (ours(sh, &mut x32, threads), ours(sh, &mut x16, threads));
            typed_amp_kernels::set_a_rows_in_place(true);
            t
        };
        let ((r32, r16), (p32, p16)) = (both(false), both(true));
        println!(
            "{:<20} {:>15} | {} {} | {} {}",
            name,
            format!("{}×{}×{}", sh.m, sh.n, sh.k),
            gf(sh, r32),
            gf(sh, p32),
            gf(sh, r16),
            gf(sh, p16),
        );
    }
}

/// The epilogue's two uses in a bf16 training step, fused against what they replace (GFLOP/s
/// counting the product's 2·m·n·k only, so the columns compare times):
/// * forward `y = relu(x·Wᵀ + b)` into bf16: `gemm` into bf16, then a bias pass and a ReLU pass
///   over C (each widening, computing and rounding again, as an elementwise op does);
/// * weight gradient `grad_Wᵀ += (1/scale)·xᵀ·g` into the f32 gradient buffer: `gemm` into a
///   bf16 temporary, then a pass that widens, scales and adds it into the f32 buffer (which
///   also rounds the gradient to bf16 once, a precision loss the fused form avoids).
fn epilogue_rows(filter: Option<&str>, threads: usize) {
    let fwd = [&SHAPES[2], &SHAPES[3], &SHAPES[4]];
    let grad = [&SHAPES[8], &SHAPES[9], &SHAPES[10]];
    println!("\nepilogue, bf16 operands: fused vs gemm + separate passes (GFLOP/s of the product)");
    println!(
        "{:<20} {:>15} | {:>7} {:>7}",
        "shape", "m×n×k", "fused", "passes"
    );
    let mut rng = StdRng::seed_from_u64(2);
    for sh in fwd {
        if filter.is_some_and(|f| !sh.name.contains(f)) {
            continue;
        }
        let x = bufs(sh, bf16::from_f32);
        let mut c = x.c.clone();
        let bias: Vec<f32> = (0..sh.n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let (a_rs, a_cs) = strides(sh.a, sh.m, sh.k);
        let (b_rs, b_cs) = strides(sh.b, sh.k, sh.n);
        let epi = Epilogue {
            bias: Some(&bias),
            activation: Activation::Relu,
            ..Epilogue::STORE
        };
        let fused = time(|| unsafe {
            typed_amp_kernels::gemm_epilogue(
                sh.m,
                sh.n,
                sh.k,
                x.a.as_ptr(),
                a_rs,
                a_cs,
                x.b.as_ptr(),
                b_rs,
                b_cs,
                c.as_mut_ptr(),
                sh.n as isize,
                1,
                &epi,
                threads,
            );
        });
        let passes = time(|| {
            unsafe {
                typed_amp_kernels::gemm(
                    sh.m,
                    sh.n,
                    sh.k,
                    x.a.as_ptr(),
                    a_rs,
                    a_cs,
                    x.b.as_ptr(),
                    b_rs,
                    b_cs,
                    c.as_mut_ptr(),
                    sh.n as isize,
                    1,
                    false,
                    threads,
                )
            };
            for row in c.chunks_exact_mut(sh.n) {
                for (y, b) in row.iter_mut().zip(&bias) {
                    *y = bf16::from_f32(y.to_f32() + b);
                }
            }
            for y in c.iter_mut() {
                *y = bf16::from_f32(y.to_f32().max(0.0));
            }
            std::hint::black_box(&c);
        });
        println!(
            "{:<20} {:>15} | {} {}",
            format!("fwd+bias+relu {}", &sh.name[4..8]),
            format!("{}×{}×{}", sh.m, sh.n, sh.k),
            gf(sh, fused),
            gf(sh, passes)
        );
    }
    for sh in grad {
        if filter.is_some_and(|f| !sh.name.contains(f)) {
            continue;
        }
        let x = bufs(sh, bf16::from_f32);
        let mut g32 = vec![0.0f32; sh.m * sh.n];
        let mut tmp = x.c.clone();
        let (a_rs, a_cs) = strides(sh.a, sh.m, sh.k);
        let (b_rs, b_cs) = strides(sh.b, sh.k, sh.n);
        let (c_rs, c_cs) = strides(sh.c, sh.m, sh.n);
        let inv_scale = 1.0 / 1024.0;
        let epi = Epilogue {
            alpha: inv_scale,
            ..Epilogue::ACCUMULATE
        };
        let fused = time(|| unsafe {
            typed_amp_kernels::gemm_epilogue::<bf16, f32>(
                sh.m,
                sh.n,
                sh.k,
                x.a.as_ptr(),
                a_rs,
                a_cs,
                x.b.as_ptr(),
                b_rs,
                b_cs,
                g32.as_mut_ptr(),
                c_rs,
                c_cs,
                &epi,
                threads,
            );
        });
        let passes = time(|| {
            unsafe {
                typed_amp_kernels::gemm(
                    sh.m,
                    sh.n,
                    sh.k,
                    x.a.as_ptr(),
                    a_rs,
                    a_cs,
                    x.b.as_ptr(),
                    b_rs,
                    b_cs,
                    tmp.as_mut_ptr(),
                    c_rs,
                    c_cs,
                    false,
                    threads,
                )
            };
            for (g, t) in g32.iter_mut().zip(&tmp) {
                *g += inv_scale * t.to_f32();
            }
            std::hint::black_box(&g32);
        });
        println!(
            "{:<20} {:>15} | {} {}",
            format!("f32 grad {}", &sh.name[4..7]),
            format!("{}×{}×{}", sh.m, sh.n, sh.k),
            gf(sh, fused),
            gf(sh, passes)
        );
    }
}
