//! The fork's `concat_along` on the CPU copies contiguous inputs as runs and keeps the index
//! loop for any other layout: both give the concatenation and its gradients, element for
//! element, checked here against values written out by index.

use typed_amp_dfdx::prelude::*;

/// `c[i][j][k]` of concatenating `a` (2 × 3 × 4) and `b` (2 × 2 × 4) along axis 1.
fn expected(a: &[[[f32; 4]; 3]; 2], b: &[[[f32; 4]; 2]; 2]) -> [[[f32; 4]; 5]; 2] {
    let mut c = [[[0.0; 4]; 5]; 2];
    for i in 0..2 {
        for j in 0..5 {
            for k in 0..4 {
                c[i][j][k] = if j < 3 { a[i][j][k] } else { b[i][j - 3][k] };
            }
        }
    }
    c
}

fn values(n: usize, offset: f32) -> Vec<f32> {
    (0..n).map(|i| offset + i as f32 * 0.25).collect()
}

#[test]
fn concat_along_contiguous_runs_and_strided_inputs_agree_with_the_index_definition() {
    let dev: Cpu = Default::default();
    let a: Tensor<Rank3<2, 3, 4>, f32, _> = dev.tensor(values(24, 1.0));
    // The same values of `b` as a contiguous tensor and as a permuted (strided) view.
    let b_vals = values(16, -3.0);
    let b: Tensor<Rank3<2, 2, 4>, f32, _> = dev.tensor(b_vals.clone());
    // b_t[k][j][i] = b[i][j][k], stored contiguously: permuted back, a strided view of b.
    let mut b_t_vals = vec![0.0; 16];
    for (n, v) in b_vals.iter().enumerate() {
        let (i, j, k) = (n / 8, n / 4 % 2, n % 4);
        b_t_vals[k * 4 + j * 2 + i] = *v;
    }
    let b_t: Tensor<Rank3<4, 2, 2>, f32, _> = dev.tensor(b_t_vals);
    let weights: Tensor<Rank3<2, 5, 4>, f32, _> = dev.tensor(values(40, 0.5));
    let w = weights.array();
    for strided in [false, true] {
        let b_in = if strided {
            b_t.clone()
                .leaky_trace()
                .permute::<Rank3<2, 2, 4>, Axes3<2, 1, 0>>()
        } else {
            b.clone().leaky_trace()
        };
        let c = (
            a.leaky_trace()
                .try_realize::<(Const<2>, usize, Const<4>)>()
                .unwrap(),
            b_in.try_realize::<(Const<2>, usize, Const<4>)>().unwrap(),
        )
            .concat_along(Axis::<1>)
            .try_realize::<Rank3<2, 5, 4>>()
            .unwrap();
        assert_eq!(
            c.array(),
            expected(&a.array(), &b.array()),
            "strided b: {strided}"
        );
        let grads = (c * weights.clone()).sum().backward();
        let ga = grads.get(&a).array();
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(ga[i][j], w[i][j], "a's gradient, strided b: {strided}");
            }
        }
        let gb: Vec<f32> = if strided {
            // b_t[k][j][i] = b[i][j][k].
            let g = grads.get(&b_t).array();
            (0..16).map(|n| g[n % 4][n / 4 % 2][n / 8]).collect()
        } else {
            grads.get(&b).as_vec()
        };
        for (n, g) in gb.iter().enumerate() {
            assert_eq!(
                *g,
                w[n / 8][3 + n / 4 % 2][n % 4],
                "b's gradient, strided b: {strided}"
            );
        }
    }
}

/// A broadcast first operand (a class token repeated over the batch, strides 0) beside a
/// contiguous second one: the runs take the first by index and the second as slices, and the
/// broadcast token's gradient sums over the batch.
#[test]
fn a_broadcast_token_beside_contiguous_tokens_concatenates_and_sums_its_gradient() {
    let dev: Cpu = Default::default();
    let token: Tensor<Rank2<1, 4>, f32, _> = dev.tensor(values(4, 2.0));
    let rest: Tensor<Rank3<3, 2, 4>, f32, _> = dev.tensor(values(24, -1.0));
    let weights: Tensor<Rank3<3, 3, 4>, f32, _> = dev.tensor(values(36, 0.5));
    let (t, r, w) = (token.array(), rest.array(), weights.array());
    let c = (
        token
            .leaky_trace()
            .broadcast::<Rank3<3, 1, 4>, Axis<0>>()
            .try_realize::<(Const<3>, usize, Const<4>)>()
            .unwrap(),
        rest.leaky_trace()
            .try_realize::<(Const<3>, usize, Const<4>)>()
            .unwrap(),
    )
        .concat_along(Axis::<1>)
        .try_realize::<Rank3<3, 3, 4>>()
        .unwrap();
    let got = c.array();
    for i in 0..3 {
        for k in 0..4 {
            assert_eq!(got[i][0][k], t[0][k]);
            for j in 0..2 {
                assert_eq!(got[i][1 + j][k], r[i][j][k]);
            }
        }
    }
    let grads = (c * weights.clone()).sum().backward();
    let (gt, gr) = (grads.get(&token).array(), grads.get(&rest).array());
    for k in 0..4 {
        // The same additions in the same order (batch 0, 1, 2) as the index loop's.
        assert_eq!(gt[0][k], w[0][0][k] + w[1][0][k] + w[2][0][k]);
        for i in 0..3 {
            for j in 0..2 {
                assert_eq!(gr[i][j][k], w[i][1 + j][k]);
            }
        }
    }
}
