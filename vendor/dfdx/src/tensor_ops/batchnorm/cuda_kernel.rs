//! typed-amp patch: CUDA keeps upstream's batch norm, composed of generic ops (the trait's
//! default methods).

use crate::{shapes::Dtype, tensor::Cuda};

impl<E: Dtype> super::BatchNormKernel<E> for Cuda {}
