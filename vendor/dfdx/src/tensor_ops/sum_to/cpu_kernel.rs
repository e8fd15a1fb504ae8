use crate::{
    dtypes::{CpuCompute, Dtype, NotMixedPrecision},
    shapes::{Axes, HasAxes, ReduceShapeTo, Shape},
    tensor::{Cpu, Tensor, Tensorlike, ZerosTensor},
    tensor_ops::utilities::reduction_utils::index_for_reductions,
};

#[cfg(feature = "f16")]
impl super::SumKernel<crate::dtypes::AMP<crate::dtypes::f16>> for Cpu {
    fn forward<Src: Shape, Dst: Shape, Ax: Axes>(
        &self,
        dst: Dst,
        inp: &Tensor<Src, crate::dtypes::AMP<crate::dtypes::f16>, Self>,
    ) -> Result<Tensor<Dst, crate::dtypes::AMP<crate::dtypes::f16>, Self>, Self::Err>
    where
        Src: ReduceShapeTo<Dst, Ax>,
    {
        let mut out = self.try_zeros_like(&dst)?;
        if Dst::NUM_DIMS == 0 {
            debug_assert_eq!(out.data.len(), 1);

            let mut tmp = 0.0f32;
            for v in inp.buf_iter() {
                tmp += v.0.to_f32();
            }
            let scale = (inp.shape.num_elements() / inp.data.len()) as f32;
            std::sync::Arc::get_mut(&mut out.data).unwrap()[0] =
                crate::dtypes::AMP(crate::dtypes::f16::from_f32(tmp * scale));
        } else {
            let num_elems_reduced = <Src as HasAxes<Ax>>::size(&inp.shape);
            let inp_buf = inp.data.as_ref();
            let mut idx = index_for_reductions::<Src, Ax>(inp.shape, inp.strides);
            for o in out.buf_iter_mut() {
                let mut tmp = 0.0f32;
                for _ in 0..num_elems_reduced {
                    tmp += inp_buf[idx.next().unwrap()].0.to_f32();
                }
                *o = crate::dtypes::AMP(crate::dtypes::f16::from_f32(tmp));
            }
        }
        Ok(out)
    }
    fn backward<Src: Shape, Dst: Shape, Ax: Axes>(
        &self,
        _dst: Dst,
        inp: &impl Tensorlike<Src, crate::dtypes::AMP<crate::dtypes::f16>, Self>,
        grad_inp: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err>
    where
        Src: ReduceShapeTo<Dst, Ax>,
    {
        if Dst::NUM_DIMS == 0 {
            debug_assert_eq!(grad_out.len(), 1);
            let v = grad_out[0].0.to_f32();
            let scale = (inp.shape().num_elements() / inp.len()) as f32;
            for i in grad_inp.iter_mut() {
                i.0 += crate::dtypes::f16::from_f32(v * scale);
            }
        } else {
            let num_elems_reduced = <Src as HasAxes<Ax>>::size(inp.shape());
            let mut idx = index_for_reductions::<Src, Ax>(*inp.shape(), inp.strides());
            for &o in grad_out.iter() {
                for _ in 0..num_elems_reduced {
                    grad_inp[idx.next().unwrap()] += o;
                }
            }
        }
        Ok(())
    }
}

// typed-amp patch: the forward accumulates in `E::Compute` (f32 for bf16, `E` otherwise; see
// [CpuCompute]) and rounds each sum once.
impl<E: Dtype + NotMixedPrecision + CpuCompute> super::SumKernel<E> for Cpu {
    fn forward<Src: Shape, Dst: Shape, Ax: Axes>(
        &self,
        dst: Dst,
        inp: &Tensor<Src, E, Self>,
    ) -> Result<Tensor<Dst, E, Self>, Self::Err>
    where
        Src: ReduceShapeTo<Dst, Ax>,
    {
        let mut out = self.try_zeros_like(&dst)?;
        if Dst::NUM_DIMS == 0 {
            debug_assert_eq!(out.data.len(), 1);
            let scale = E::from_usize(inp.shape.num_elements() / inp.data.len()).unwrap();
            // typed-amp patch: summed in 8 lanes (in f32 for 16-bit types), not one chain.
            let tmp: E = sum_all(&inp.data);
            std::sync::Arc::get_mut(&mut out.data).unwrap()[0] = tmp * scale;
        } else {
            let num_elems_reduced = <Src as HasAxes<Ax>>::size(&inp.shape);
            let inp_buf = inp.data.as_ref();
            let mut idx = index_for_reductions::<Src, Ax>(inp.shape, inp.strides);
            for o in out.buf_iter_mut() {
                let mut tmp: E::Compute = Default::default();
                for _ in 0..num_elems_reduced {
                    tmp += inp_buf[idx.next().unwrap()].widen();
                }
                *o = E::narrow(tmp);
            }
        }
        Ok(out)
    }
    fn backward<Src: Shape, Dst: Shape, Ax: Axes>(
        &self,
        _dst: Dst,
        inp: &impl Tensorlike<Src, E, Self>,
        grad_inp: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err>
    where
        Src: ReduceShapeTo<Dst, Ax>,
    {
        if Dst::NUM_DIMS == 0 {
            debug_assert_eq!(grad_out.len(), 1);
            let v = grad_out[0];
            let scale = E::from_usize(inp.shape().num_elements() / inp.len()).unwrap();
            // typed-amp patch: the same `grad += v · scale` for every element, 16-bit types
            // converted a block at a time (the same single rounding as `half`'s addition).
            add_const(grad_inp, v * scale);
        } else if E::WIDENS {
            // typed-amp patch: a broadcast input (stride 0) receives many of these additions in
            // one element; bf16 accumulates them in f32 and rounds each gradient once.
            let num_elems_reduced = <Src as HasAxes<Ax>>::size(inp.shape());
            let mut idx = index_for_reductions::<Src, Ax>(*inp.shape(), inp.strides());
            let mut acc: std::vec::Vec<E::Compute> = grad_inp.iter().map(|g| g.widen()).collect();
            for &o in grad_out.iter() {
                let o = o.widen();
                for _ in 0..num_elems_reduced {
                    acc[idx.next().unwrap()] += o;
                }
            }
            for (g, a) in grad_inp.iter_mut().zip(acc) {
                *g = E::narrow(a);
            }
        } else {
            let num_elems_reduced = <Src as HasAxes<Ax>>::size(inp.shape());
            let mut idx = index_for_reductions::<Src, Ax>(*inp.shape(), inp.strides());
            for &o in grad_out.iter() {
                for _ in 0..num_elems_reduced {
                    grad_inp[idx.next().unwrap()] += o;
                }
            }
        }
        Ok(())
    }
}

/// typed-amp patch: `Σ x` in 8 interleaved lanes, in f32 for 16-bit types.
fn sum_all<E: Dtype>(x: &[E]) -> E {
    use crate::tensor_ops::utilities::cpu_f32::{is_half, to_f32, BLOCK};
    fn lanes<T: Dtype>(x: &[T]) -> T {
        let (chunks, rest) = x.as_chunks::<8>();
        let mut acc = [T::default(); 8];
        for c in chunks {
            for i in 0..8 {
                acc[i] += c[i];
            }
        }
        let mut s = T::default();
        for a in acc {
            s += a;
        }
        for v in rest {
            s += *v;
        }
        s
    }
    if is_half::<E>() {
        let mut buf = [0.0f32; BLOCK];
        let mut s = 0.0f32;
        for c in x.chunks(BLOCK) {
            let b = &mut buf[..c.len()];
            to_f32(c, b);
            s += lanes(b);
        }
        E::from_f32(s).unwrap()
    } else {
        lanes(x)
    }
}

/// typed-amp patch: `g[i] += c` for every element, in f32 for 16-bit types.
fn add_const<E: Dtype>(g: &mut [E], c: E) {
    use crate::tensor_ops::utilities::cpu_f32::{from_f32, is_half, to_f32, BLOCK};
    if is_half::<E>() {
        let c = c.to_f32().unwrap();
        let mut buf = [0.0f32; BLOCK];
        for g in g.chunks_mut(BLOCK) {
            let b = &mut buf[..g.len()];
            to_f32(g, b);
            for v in b.iter_mut() {
                *v += c;
            }
            from_f32(b, g);
        }
    } else {
        for v in g.iter_mut() {
            *v += c;
        }
    }
}
