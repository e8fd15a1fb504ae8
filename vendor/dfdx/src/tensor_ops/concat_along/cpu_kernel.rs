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
        // typed-amp patch: the output as runs of `a_n` and `b_n` elements, each operand's part
        // copied from a slice where that operand is contiguous (the usual case) instead of one
        // index step an element, by index where it is not (a broadcast class token beside
        // contiguous tokens went element by element whole); the same elements land in the same
        // places.
        let contiguous = [
            a.strides == a.shape.strides(),
            b.strides == b.shape.strides(),
        ];
        if a_n > 0 && b_n > 0 && contiguous.contains(&true) {
            for (r, out) in buf.chunks_mut(a_n + b_n).enumerate() {
                let (oa, ob) = out.split_at_mut(a_n);
                if contiguous[0] {
                    oa.copy_from_slice(&a.data[r * a_n..(r + 1) * a_n]);
                } else {
                    oa.iter_mut()
                        .for_each(|o| *o = a.data[a_idx.next().unwrap()]);
                }
                if contiguous[1] {
                    ob.copy_from_slice(&b.data[r * b_n..(r + 1) * b_n]);
                } else {
                    ob.iter_mut()
                        .for_each(|o| *o = b.data[b_idx.next().unwrap()]);
                }
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
        // typed-amp patch: runs, as in the forward (a contiguous operand's part added as a
        // slice, the other's by index); each element's sum is the same single addition in the
        // same order, so the bits are the index loop's.
        let contiguous = [
            a.strides == a.shape.strides(),
            b.strides == b.shape.strides(),
        ];
        if a_n > 0 && b_n > 0 && contiguous.contains(&true) {
            for (r, g) in grad_out.chunks(a_n + b_n).enumerate() {
                let (ga, gb) = g.split_at(a_n);
                if contiguous[0] {
                    let sink = &mut grad_a[r * a_n..(r + 1) * a_n];
                    sink.iter_mut().zip(ga).for_each(|(x, y)| *x += *y);
                } else {
                    ga.iter().for_each(|y| grad_a[a_idx.next().unwrap()] += *y);
                }
                if contiguous[1] {
                    let sink = &mut grad_b[r * b_n..(r + 1) * b_n];
                    sink.iter_mut().zip(gb).for_each(|(x, y)| *x += *y);
                } else {
                    gb.iter().for_each(|y| grad_b[b_idx.next().unwrap()] += *y);
                }
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
