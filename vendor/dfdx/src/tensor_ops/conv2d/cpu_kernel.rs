// typed-amp patch: the CPU convolution is rewritten for speed (upstream's computed every im2col
// element's source with index arithmetic, and its backward searched, per element of an
// unfolded `grad_out`, for the output it came from). Here:
//
// - forward, per image: `cols = im2col(x)` (`C·K·K × OH·OW`), built row by row with the valid
//   output range of each kernel tap computed once, then `y = W · cols` through `MatMulImpl`;
// - backward, per image: `cols = im2col(x)` again, `dW += dY · colsᵀ`, `dcols = Wᵀ · dY` and
//   `dX += col2im(dcols)` (the adjoint of im2col: a transposed convolution);
// - images are split into a fixed number of pieces (set by the batch size alone) that rayon runs
//   in parallel, each with its own scratch buffers and its own partial filter gradient; the
//   partials are summed in piece order, so results do not depend on the thread count;
// - 16-bit types multiply through `MatMulImpl<E>` as before; the additions outside the GEMM
//   (col2im, summing the filter-gradient partials) are done in `f32` and rounded once.
use crate::shapes::{Dtype, Shape};
use crate::tensor::{cpu::*, *};
use crate::tensor_ops::matmul::cpu_kernel::MatMulImpl;
use crate::tensor_ops::utilities::cpu_f32::{
    add_from_f32, as_f32, as_f32_mut, from_f32, par_chunks_mut, pieces, to_f32, with_scratch,
};

use super::{Conv2DKernel, Conv2DOp};

use std::sync::Arc;

/// The range `lo..hi` of output positions `o` whose input position `o·stride + offset` lies in
/// `0..len_in`, clamped to `0..len_out`.
#[inline]
fn valid_range(len_out: usize, len_in: usize, stride: usize, offset: isize) -> (usize, usize) {
    let s = stride as isize;
    let lo = if offset >= 0 {
        0
    } else {
        ((-offset + s - 1) / s) as usize
    };
    let last = len_in as isize - 1 - offset;
    let hi = if last < 0 {
        0
    } else {
        ((last / s) as usize + 1).min(len_out)
    };
    (lo.min(hi), hi)
}

impl Conv2DOp {
    /// Rows of the unfolded image (per group): `C/G · K · K`.
    fn col_rows(&self) -> usize {
        (self.chan_in / self.groups) * self.kernel * self.kernel
    }

    /// `cols[(c·K + ki)·K + kj][oh·OW + ow] = img[c][oh·s + ki·d − p][ow·s + kj·d − p]`, zero
    /// where that falls in the padding. `img` holds one image, `C × H × W`; row `r` of `cols`
    /// starts at `r · ld`.
    fn im2col<E: Copy + Default>(&self, img: &[E], cols: &mut [E], ld: usize) {
        let (k, s, d, p) = (
            self.kernel,
            self.stride,
            self.dilation,
            self.padding as isize,
        );
        let (h, w, oh_n, ow_n) = (self.h_in, self.w_in, self.h_out, self.w_out);
        let ohw = oh_n * ow_n;
        let zero = E::default();
        for c in 0..self.chan_in {
            let plane = &img[c * h * w..(c + 1) * h * w];
            for ki in 0..k {
                let y_off = (ki * d) as isize - p;
                let (oh_lo, oh_hi) = valid_range(oh_n, h, s, y_off);
                for kj in 0..k {
                    let x_off = (kj * d) as isize - p;
                    let (ow_lo, ow_hi) = valid_range(ow_n, w, s, x_off);
                    let r = (c * k + ki) * k + kj;
                    let row = &mut cols[r * ld..r * ld + ohw];
                    row[..oh_lo * ow_n].fill(zero);
                    row[oh_hi * ow_n..].fill(zero);
                    if s == 1 && ow_n == w && oh_lo < oh_hi && ow_lo < ow_hi {
                        // Unit stride, output as wide as the input: the unfolded row is the
                        // plane shifted by a constant, so copy the whole span at once, then
                        // zero the padding columns (which the span filled from the neighbouring
                        // rows).
                        let y0 = (oh_lo as isize + y_off) as usize;
                        let dst0 = oh_lo * w + ow_lo;
                        let src0 = y0 * w + (ow_lo as isize + x_off) as usize;
                        let len = (oh_hi - oh_lo - 1) * w + (ow_hi - ow_lo);
                        row[dst0..dst0 + len].copy_from_slice(&plane[src0..src0 + len]);
                        for oh in oh_lo..oh_hi {
                            let r = &mut row[oh * w..(oh + 1) * w];
                            for v in &mut r[..ow_lo] {
                                *v = zero;
                            }
                            for v in &mut r[ow_hi..] {
                                *v = zero;
                            }
                        }
                        continue;
                    }
                    for oh in oh_lo..oh_hi {
                        let y = (oh * s) as isize + y_off;
                        let src = &plane[y as usize * w..(y as usize + 1) * w];
                        let dst = &mut row[oh * ow_n..(oh + 1) * ow_n];
                        dst[..ow_lo].fill(zero);
                        dst[ow_hi..].fill(zero);
                        if ow_lo < ow_hi {
                            let x0 = ((ow_lo * s) as isize + x_off) as usize;
                            let dst = &mut dst[ow_lo..ow_hi];
                            if s == 1 {
                                dst.copy_from_slice(&src[x0..x0 + dst.len()]);
                            } else {
                                for (i, v) in dst.iter_mut().enumerate() {
                                    *v = src[x0 + i * s];
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The adjoint of [Self::im2col]: `img[c][y][x] += cols[..][..]` for every unfolded element
    /// that was read from `(c, y, x)`. Row `r` of `cols` starts at `r · ld`.
    ///
    /// `cols` is scratch: the kernel may zero the entries that fall in the padding.
    fn col2im(&self, cols: &mut [f32], ld: usize, img: &mut [f32]) {
        let (k, s, d, p) = (
            self.kernel,
            self.stride,
            self.dilation,
            self.padding as isize,
        );
        let (h, w, oh_n, ow_n) = (self.h_in, self.w_in, self.h_out, self.w_out);
        let ohw = oh_n * ow_n;
        for c in 0..self.chan_in {
            let plane = &mut img[c * h * w..(c + 1) * h * w];
            for ki in 0..k {
                let y_off = (ki * d) as isize - p;
                let (oh_lo, oh_hi) = valid_range(oh_n, h, s, y_off);
                for kj in 0..k {
                    let x_off = (kj * d) as isize - p;
                    let (ow_lo, ow_hi) = valid_range(ow_n, w, s, x_off);
                    if ow_lo >= ow_hi {
                        continue;
                    }
                    let r = (c * k + ki) * k + kj;
                    let row = &mut cols[r * ld..r * ld + ohw];
                    if s == 1 && ow_n == w && oh_lo < oh_hi {
                        // As in im2col: one span, shifted by a constant, once the padding
                        // columns (which the span maps onto the neighbouring rows) are zeroed.
                        for oh in oh_lo..oh_hi {
                            let r = &mut row[oh * w..(oh + 1) * w];
                            for v in &mut r[..ow_lo] {
                                *v = 0.0;
                            }
                            for v in &mut r[ow_hi..] {
                                *v = 0.0;
                            }
                        }
                        let y0 = (oh_lo as isize + y_off) as usize;
                        let src0 = oh_lo * w + ow_lo;
                        let dst0 = y0 * w + (ow_lo as isize + x_off) as usize;
                        let len = (oh_hi - oh_lo - 1) * w + (ow_hi - ow_lo);
                        for (o, v) in plane[dst0..dst0 + len]
                            .iter_mut()
                            .zip(&row[src0..src0 + len])
                        {
                            *o += *v;
                        }
                        continue;
                    }
                    let row = &*row;
                    for oh in oh_lo..oh_hi {
                        let y = ((oh * s) as isize + y_off) as usize;
                        let x0 = ((ow_lo * s) as isize + x_off) as usize;
                        let src = &row[oh * ow_n + ow_lo..oh * ow_n + ow_hi];
                        let dst = &mut plane[y * w..(y + 1) * w];
                        if s == 1 {
                            for (o, v) in dst[x0..x0 + src.len()].iter_mut().zip(src) {
                                *o += *v;
                            }
                        } else {
                            for (i, v) in src.iter().enumerate() {
                                dst[x0 + i * s] += *v;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Whether the unfolded image is the image itself (1×1 filters, stride 1, no padding).
    fn is_pointwise(&self) -> bool {
        self.kernel == 1 && self.stride == 1 && self.padding == 0
    }
}

/// Images per GEMM: enough to give the products about this many columns.
const GEMM_COLS: usize = 1024;

impl Conv2DOp {
    /// How many images share one GEMM (their unfolded columns side by side).
    fn group_len(&self) -> usize {
        (GEMM_COLS / (self.h_out * self.w_out).max(1)).max(1)
    }
}

impl Cpu {
    /// `out = W · im2col(img)` for the images in `img` (`n × C·H·W`), into `out` (`n × O·OH·OW`).
    fn conv_fwd_images<E: Dtype>(op: &Conv2DOp, img: &[E], filters: &[E], out: &mut [E])
    where
        Self: MatMulImpl<E>,
    {
        let img_len = op.chan_in * op.h_in * op.w_in;
        let out_len = op.chan_out * op.h_out * op.w_out;
        let m = op.chan_out / op.groups;
        let k = op.col_rows();
        let ohw = op.h_out * op.w_out;
        let n_imgs = img.len() / img_len;
        let group = op.group_len().min(n_imgs);
        let tmp_len = if group > 1 {
            op.chan_out * group * ohw
        } else {
            0
        };
        let lens = [op.groups * k * group * ohw, tmp_len];
        with_scratch::<E, f32, _, 2, 0>(lens, [], |[cols, tmp], []| {
            for (imgs, outs) in img
                .chunks(group * img_len)
                .zip(out.chunks_mut(group * out_len))
            {
                let nb = imgs.len() / img_len;
                let n = nb * ohw;
                if nb == 1 && op.is_pointwise() {
                    // The image is its own unfolding.
                    for g in 0..op.groups {
                        Self::matmul(
                            (m, k, n),
                            false,
                            filters[g * m * k..].as_ptr(),
                            [k, 1],
                            imgs[g * k * n..].as_ptr(),
                            [n, 1],
                            outs[g * m * n..].as_mut_ptr(),
                            [n, 1],
                        );
                    }
                    continue;
                }
                // cols: (G·k) × n, image i in columns i·ohw..(i+1)·ohw.
                for (i, im) in imgs.chunks_exact(img_len).enumerate() {
                    op.im2col(im, &mut cols[i * ohw..], n);
                }
                // y (O × n) = W · cols, straight into the output for one image.
                let (dst, ld): (&mut [E], usize) = if nb == 1 {
                    (&mut *outs, n)
                } else {
                    (&mut *tmp, n)
                };
                for g in 0..op.groups {
                    Self::matmul(
                        (m, k, n),
                        false,
                        filters[g * m * k..].as_ptr(),
                        [k, 1],
                        cols[g * k * n..].as_ptr(),
                        [n, 1],
                        dst[g * m * ld..].as_mut_ptr(),
                        [ld, 1],
                    );
                }
                if nb > 1 {
                    for (i, out) in outs.chunks_exact_mut(out_len).enumerate() {
                        for (o, row) in out.chunks_exact_mut(ohw).enumerate() {
                            row.copy_from_slice(&tmp[o * n + i * ohw..][..ohw]);
                        }
                    }
                }
            }
        })
    }

    /// For the images in `img` and `grad_out`: `grad_img += col2im(Wᵀ · grad_out)`, and
    /// `grad_w += grad_out · im2col(img)ᵀ` (in `f32`, `grad_w` is `O × C/G·K·K`).
    #[allow(clippy::too_many_arguments)]
    fn conv_bwd_images<E: Dtype>(
        op: &Conv2DOp,
        img: &[E],
        grad_img: &mut [E],
        filters: &[E],
        grad_w: &mut [f32],
        grad_out: &[E],
    ) where
        Self: MatMulImpl<E>,
    {
        let img_len = op.chan_in * op.h_in * op.w_in;
        let out_len = op.chan_out * op.h_out * op.w_out;
        let m = op.chan_out / op.groups;
        let k = op.col_rows();
        let ohw = op.h_out * op.w_out;
        let n_imgs = img.len() / img_len;
        let group = op.group_len().min(n_imgs);
        let is_f32 = as_f32(filters).is_some();
        let width = group * ohw;
        // cols; for f32, dcols; the output gradient of a group of images, channels by columns;
        // and for 16-bit types, the unfolded gradient and the image gradient in f32 (the
        // products write their f32 sums straight there and into `grad_w`: nothing is rounded
        // to 16 bits and widened again).
        let dy_len = if group > 1 { op.chan_out * width } else { 0 };
        let (full, half) = if is_f32 { (1, 0) } else { (0, 1) };
        let lens_e = [op.groups * k * width, full * op.groups * k * width, dy_len];
        let lens_f = [half * op.groups * k * width, half * img_len];
        with_scratch::<E, f32, _, 3, 2>(lens_e, lens_f, |[cols, dcols, dy], [dcols32, dimg32]| {
            for ((imgs, grad_imgs), grad_outs) in img
                .chunks(group * img_len)
                .zip(grad_img.chunks_mut(group * img_len))
                .zip(grad_out.chunks(group * out_len))
            {
                let nb = imgs.len() / img_len;
                let n = nb * ohw;
                let pointwise = nb == 1 && op.is_pointwise();
                let cols: &[E] = if pointwise {
                    imgs
                } else {
                    for (i, im) in imgs.chunks_exact(img_len).enumerate() {
                        op.im2col(im, &mut cols[i * ohw..], n);
                    }
                    &*cols
                };
                let dy: &[E] = if nb == 1 {
                    grad_outs
                } else {
                    for (i, go) in grad_outs.chunks_exact(out_len).enumerate() {
                        for (o, row) in go.chunks_exact(ohw).enumerate() {
                            dy[o * n + i * ohw..][..ohw].copy_from_slice(row);
                        }
                    }
                    &*dy
                };
                for g in 0..op.groups {
                    // dW[g] (m × k) += dY[g] (m × n) · cols[g]ᵀ (n × k)
                    let dyp = dy[g * m * n..].as_ptr();
                    let c = cols[g * k * n..].as_ptr();
                    if is_f32 {
                        Self::matmul(
                            (m, n, k),
                            true,
                            dyp,
                            [n, 1],
                            c,
                            [1, n],
                            grad_w[g * m * k..].as_mut_ptr() as *mut E,
                            [k, 1],
                        );
                    } else {
                        Self::matmul_f32_out(
                            (m, n, k),
                            true,
                            dyp,
                            [n, 1],
                            c,
                            [1, n],
                            grad_w[g * m * k..].as_mut_ptr(),
                            [k, 1],
                        );
                    }
                    // dcols[g] (k × n) = W[g]ᵀ (k × m) · dY[g] (m × n)
                    let w = filters[g * m * k..].as_ptr();
                    if is_f32 {
                        Self::matmul(
                            (k, m, n),
                            false,
                            w,
                            [1, k],
                            dyp,
                            [n, 1],
                            dcols[g * k * n..].as_mut_ptr(),
                            [n, 1],
                        );
                    } else {
                        Self::matmul_f32_out(
                            (k, m, n),
                            false,
                            w,
                            [1, k],
                            dyp,
                            [n, 1],
                            dcols32[g * k * n..].as_mut_ptr(),
                            [n, 1],
                        );
                    }
                }
                let dcols_len = op.groups * k * n;
                let dcols32: &mut [f32] = if is_f32 {
                    as_f32_mut(&mut dcols[..dcols_len]).unwrap()
                } else {
                    &mut dcols32[..dcols_len]
                };
                for (i, grad_img) in grad_imgs.chunks_exact_mut(img_len).enumerate() {
                    match as_f32_mut(grad_img) {
                        Some(grad_img) if pointwise => {
                            for (gi, v) in grad_img.iter_mut().zip(dcols32.iter()) {
                                *gi += *v;
                            }
                        }
                        Some(grad_img) => op.col2im(&mut dcols32[i * ohw..], n, grad_img),
                        None if pointwise => add_from_f32(&dcols32[..img_len], grad_img),
                        None => {
                            dimg32.fill(0.0);
                            op.col2im(&mut dcols32[i * ohw..], n, dimg32);
                            add_from_f32(dimg32, grad_img);
                        }
                    }
                }
            }
        })
    }
}

/// `row[i] += b`, in f32 (one rounding, as the elementwise add).
fn add_bias_row<E: Dtype>(row: &mut [E], b: f32) {
    match as_f32_mut(row) {
        Some(row) => {
            for v in row {
                *v += b;
            }
        }
        None => {
            let mut buf = [0.0f32; 256];
            for c in row.chunks_mut(256) {
                let t = &mut buf[..c.len()];
                to_f32(c, t);
                for v in t.iter_mut() {
                    *v += b;
                }
                from_f32(t, c);
            }
        }
    }
}

/// `Σ row`, in f32: 8 interleaved lanes, then the lanes.
fn sum_row<E: Dtype>(row: &[E]) -> f32 {
    fn lanes(x: &[f32]) -> f32 {
        let (chunks, rest) = x.as_chunks::<8>();
        let mut acc = [0.0f32; 8];
        for c in chunks {
            for i in 0..8 {
                acc[i] += c[i];
            }
        }
        let mut s = 0.0;
        for a in acc {
            s += a;
        }
        for v in rest {
            s += *v;
        }
        s
    }
    match as_f32(row) {
        Some(row) => lanes(row),
        None => {
            let mut buf = [0.0f32; 256];
            let mut s = 0.0;
            for c in row.chunks(256) {
                let t = &mut buf[..c.len()];
                to_f32(c, t);
                s += lanes(t);
            }
            s
        }
    }
}

impl Cpu {
    /// The forward over the batch in parallel pieces, with an optional bias.
    fn conv_fwd<E: Dtype>(
        op: Conv2DOp,
        lhs: &[E],
        filters: &[E],
        bias: Option<&[f32]>,
        out: &mut [E],
    ) where
        Self: MatMulImpl<E>,
    {
        // typed-amp patch: the step breakdown counts convolutions as products.
        let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
        // The op checked that `lhs` and `rhs` are contiguous; `out` was just allocated.
        let img_len = op.chan_in * op.h_in * op.w_in;
        let out_len = op.chan_out * op.h_out * op.w_out;
        let lhs = &lhs[..op.batch * img_len];
        let out = &mut out[..op.batch * out_len];
        let per_piece = op.batch.div_ceil(pieces(op.batch));
        par_chunks_mut(out, per_piece * out_len, |i, out| {
            let img = &lhs[i * per_piece * img_len..][..out.len() / out_len * img_len];
            Self::conv_fwd_images(&op, img, filters, out);
            if let Some(bias) = bias {
                for out in out.chunks_exact_mut(out_len) {
                    let rows = out.chunks_exact_mut(op.h_out * op.w_out);
                    for (row, b) in rows.zip(bias) {
                        add_bias_row(row, *b);
                    }
                }
            }
        });
    }

    /// The backward over the batch in parallel pieces; with `grad_bias`, also the bias
    /// gradient.
    #[allow(clippy::too_many_arguments)]
    fn conv_bwd<E: Dtype>(
        op: Conv2DOp,
        lhs: &[E],
        grad_lhs: &mut [E],
        filters: &[E],
        grad_rhs: &mut [E],
        grad_bias: Option<&mut [E]>,
        grad_out: &[E],
    ) where
        Self: MatMulImpl<E>,
    {
        // typed-amp patch: the step breakdown counts convolutions as products.
        let _timing = typed_amp_kernels::timing::scope(typed_amp_kernels::timing::Kind::Products);
        let img_len = op.chan_in * op.h_in * op.w_in;
        let ohw = op.h_out * op.w_out;
        let out_len = op.chan_out * ohw;
        let w_len = op.chan_out * op.col_rows();
        // Each piece's partial filter gradient and, with a bias, its partial bias gradient.
        let part_len = w_len + if grad_bias.is_some() { op.chan_out } else { 0 };
        let with_bias = grad_bias.is_some();
        let lhs = &lhs[..op.batch * img_len];
        let grad_out = &grad_out[..op.batch * out_len];
        let n_pieces = pieces(op.batch);
        let per_piece = op.batch.div_ceil(n_pieces);
        let mut partials = std::vec![0.0f32; n_pieces * part_len];
        {
            let partials = crate::tensor_ops::utilities::cpu_f32::SendPtr(partials.as_mut_ptr());
            par_chunks_mut(
                &mut grad_lhs[..op.batch * img_len],
                per_piece * img_len,
                |i, grad_img| {
                    let b0 = i * per_piece;
                    let nb = grad_img.len() / img_len;
                    let p = partials;
                    // SAFETY: piece `i` alone writes its `part_len` partials.
                    let part =
                        unsafe { std::slice::from_raw_parts_mut(p.0.add(i * part_len), part_len) };
                    let (grad_w, grad_b) = part.split_at_mut(w_len);
                    let grad_out = &grad_out[b0 * out_len..(b0 + nb) * out_len];
                    Self::conv_bwd_images(
                        &op,
                        &lhs[b0 * img_len..(b0 + nb) * img_len],
                        grad_img,
                        filters,
                        grad_w,
                        grad_out,
                    );
                    if with_bias {
                        for go in grad_out.chunks_exact(out_len) {
                            for (gb, row) in grad_b.iter_mut().zip(go.chunks_exact(ohw)) {
                                *gb += sum_row(row);
                            }
                        }
                    }
                },
            );
        }
        let (total, rest) = partials.split_at_mut(part_len);
        for part in rest.chunks_exact(part_len) {
            for (t, v) in total.iter_mut().zip(part) {
                *t += *v;
            }
        }
        add_from_f32(&total[..w_len], &mut grad_rhs[..w_len]);
        if let Some(grad_bias) = grad_bias {
            add_from_f32(&total[w_len..], &mut grad_bias[..op.chan_out]);
        }
    }
}

impl<E: Dtype> Conv2DKernel<E> for Cpu
where
    Self: MatMulImpl<E>,
{
    fn alloc<S: Shape>(&self, s: S) -> Result<Tensor<S, E, Self>, Self::Err> {
        self.try_zeros_like(&s)
    }

    fn forward<L: Shape, R: Shape, O: Shape>(
        &self,
        op: Conv2DOp,
        lhs: &Tensor<L, E, Self>,
        rhs: &Tensor<R, E, Self>,
        out: &mut Tensor<O, E, Self>,
    ) -> Result<(), Self::Err> {
        let out = Arc::make_mut(&mut out.data);
        Self::conv_fwd(op, &lhs.data, &rhs.data, None, out);
        Ok(())
    }

    fn backward<L: Shape, R: Shape, O: Shape>(
        &self,
        op: Conv2DOp,
        lhs: &Tensor<L, E, Self>,
        grad_lhs: &mut Self::Vec,
        rhs: &Tensor<R, E, Self>,
        grad_rhs: &mut Self::Vec,
        _out: &impl Tensorlike<O, E, Self>,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        Self::conv_bwd(op, &lhs.data, grad_lhs, &rhs.data, grad_rhs, None, grad_out);
        Ok(())
    }

    const FUSED_BIAS: bool = true;

    fn forward_bias<L: Shape, R: Shape, B: Shape, O: Shape>(
        &self,
        op: Conv2DOp,
        lhs: &Tensor<L, E, Self>,
        rhs: &Tensor<R, E, Self>,
        bias: &Tensor<B, E, Self>,
        out: &mut Tensor<O, E, Self>,
    ) -> Result<(), Self::Err> {
        let mut b = std::vec![0.0f32; op.chan_out];
        to_f32(&bias.data[..op.chan_out], &mut b);
        let out = Arc::make_mut(&mut out.data);
        Self::conv_fwd(op, &lhs.data, &rhs.data, Some(&b), out);
        Ok(())
    }

    fn backward_bias<L: Shape, R: Shape, O: Shape>(
        &self,
        op: Conv2DOp,
        lhs: &Tensor<L, E, Self>,
        grad_lhs: &mut Self::Vec,
        rhs: &Tensor<R, E, Self>,
        grad_rhs: &mut Self::Vec,
        grad_bias: &mut Self::Vec,
        _out: &impl Tensorlike<O, E, Self>,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        Self::conv_bwd(
            op,
            &lhs.data,
            grad_lhs,
            &rhs.data,
            grad_rhs,
            Some(grad_bias),
            grad_out,
        );
        Ok(())
    }
}
