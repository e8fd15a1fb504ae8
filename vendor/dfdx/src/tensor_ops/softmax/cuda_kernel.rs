//! typed-amp patch: CUDA keeps upstream's softmax, composed of generic ops (the trait's
//! default method).

use crate::{shapes::Dtype, tensor::Cuda};

impl<E: Dtype> super::SoftmaxKernel<E> for Cuda {}
