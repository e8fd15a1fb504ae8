//! The fork's reshape skips its backward when nobody reads its input's gradient
//! (`Gradients::mark_unwanted`), as its matmul does for a first layer's input; a wanted input
//! still gets dfdx's gradient.

use typed_amp_dfdx::prelude::*;

/// `sum(reshape(permute(x)) * w)` traced into `grads`, with `x` (2 × 3 × 4) permuted to
/// 4 × 3 × 2 and reshaped (a copy, as the view is not contiguous) to 4 × 6.
fn backward(
    x: &Tensor<Rank3<2, 3, 4>, f32, Cpu>,
    grads: Gradients<f32, Cpu>,
) -> Gradients<f32, Cpu> {
    let dev = x.device().clone();
    let w: Tensor<Rank2<4, 6>, f32, Cpu> =
        dev.tensor((0..24).map(|i| i as f32 - 11.5).collect::<Vec<_>>());
    let y = x
        .clone()
        .trace(grads)
        .permute::<Rank3<4, 3, 2>, _>()
        .reshape::<Rank2<4, 6>>();
    (y * w).sum().backward()
}

#[test]
fn reshape_of_an_unwanted_input_computes_no_gradient_and_a_wanted_one_gets_dfdx_s() {
    let dev: Cpu = Default::default();
    let x: Tensor<Rank3<2, 3, 4>, f32, _> =
        dev.tensor((0..24).map(|i| i as f32 * 0.5).collect::<Vec<_>>());

    let mut unwanted = Gradients::leaky();
    unwanted.mark_unwanted(&[x.id()]);
    let grads = backward(&x, unwanted);
    assert!(
        grads.get_ref_checked(&x).is_none(),
        "the reshape computed a gradient nobody reads"
    );

    // d/dx[i][j][k] of Σ w[k][j·2 + i] · x[i][j][k] is w[k][j·2 + i].
    let grads = backward(&x, Gradients::leaky());
    let got = grads.get(&x).array();
    for (i, plane) in got.iter().enumerate() {
        for (j, row) in plane.iter().enumerate() {
            for (k, g) in row.iter().enumerate() {
                assert_eq!(*g, (k * 6 + j * 2 + i) as f32 - 11.5, "x[{i}][{j}][{k}]");
            }
        }
    }
}
