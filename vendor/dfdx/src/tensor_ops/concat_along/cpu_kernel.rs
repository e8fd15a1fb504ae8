use crate::{
    shapes::*,
    tensor::{cpu::NdIndex, *},
};

impl<E: Dtype> super::ConcatAlongKernel<E> for Cpu {
    fn forward<A: Shape, B: Shape, C: Shape>(
        &self,
        ax: usize,
        a: &Tensor<A, E, Self>,
        b: &Tensor<B, E, Self>,
        c: &mut Tensor<C, E, Self>,
    ) -> Result<(), Self::Err> {
        let mut a_idx = NdIndex::new(a.shape, a.strides);
        let mut b_idx = NdIndex::new(b.shape, b.strides);

        let mut a_n = 1;
        let mut b_n = 1;
        for i in ax..A::NUM_DIMS {
            a_n *= a_idx.shape[i];
            b_n *= b_idx.shape[i];
        }

        let n = c.data.len();
        let buf = std::sync::Arc::get_mut(&mut c.data).unwrap();
        // typed-amp: contiguous inputs (the usual case) go as runs of `a_n` and `b_n` elements
        // instead of one index step each; the same elements land in the same places.
        if a_n > 0 && b_n > 0 && a.strides == a.shape.strides() && b.strides == b.shape.strides() {
            let runs = buf.chunks_mut(a_n + b_n);
            let sources = a.data.chunks(a_n).zip(b.data.chunks(b_n));
            for (out, (ra, rb)) in runs.zip(sources) {
                out[..a_n].copy_from_slice(&ra[..a_n]);
                out[a_n..].copy_from_slice(&rb[..b_n]);
            }
            return Ok(());
        }
        let mut i = 0;
        while i < n {
            for _ in 0..a_n {
                buf[i] = a.data[a_idx.next().unwrap()];
                i += 1;
            }
            for _ in 0..b_n {
                buf[i] = b.data[b_idx.next().unwrap()];
                i += 1;
            }
        }
        Ok(())
    }
    fn backward<A: Shape, B: Shape>(
        &self,
        ax: usize,
        a: &GhostTensor<A, E, Self>,
        grad_a: &mut Self::Vec,
        b: &GhostTensor<B, E, Self>,
        grad_b: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let mut a_idx = NdIndex::new(a.shape, a.strides);
        let mut b_idx = NdIndex::new(b.shape, b.strides);

        let mut a_n = 1;
        let mut b_n = 1;
        for i in ax..A::NUM_DIMS {
            a_n *= a_idx.shape[i];
            b_n *= b_idx.shape[i];
        }

        let n = grad_out.len();
        // typed-amp: contiguous inputs as runs, as in the forward; each element's sum is the
        // same single addition, so the bits are the index loop's.
        if a_n > 0 && b_n > 0 && a.strides == a.shape.strides() && b.strides == b.shape.strides() {
            let runs = grad_out.chunks(a_n + b_n);
            let sinks = grad_a.chunks_mut(a_n).zip(grad_b.chunks_mut(b_n));
            for (g, (ga, gb)) in runs.zip(sinks) {
                ga[..a_n]
                    .iter_mut()
                    .zip(&g[..a_n])
                    .for_each(|(x, y)| *x += *y);
                gb[..b_n]
                    .iter_mut()
                    .zip(&g[a_n..])
                    .for_each(|(x, y)| *x += *y);
            }
            return Ok(());
        }
        let mut i = 0;
        while i < n {
            for _ in 0..a_n {
                grad_a[a_idx.next().unwrap()] += grad_out[i];
                i += 1;
            }
            for _ in 0..b_n {
                grad_b[b_idx.next().unwrap()] += grad_out[i];
                i += 1;
            }
        }
        Ok(())
    }
}
