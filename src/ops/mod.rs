//! Differentiable ops that mixed precision adds to dfdx.

pub mod cast;
