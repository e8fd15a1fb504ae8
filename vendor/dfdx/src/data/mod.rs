//! A collection of useful data utilities such as [ExactSizeDataset], [OneHotEncode], [Arange],
//! and iterator extension traits!
mod arange;
mod batch;
mod collate;
mod dataset;
mod one_hot_encode;
mod stack;

pub use arange::Arange;
pub use batch::IteratorBatchExt;
pub use collate::{Collate, IteratorCollateExt};
pub use dataset::ExactSizeDataset;
pub use one_hot_encode::OneHotEncode;
pub use stack::IteratorStackExt;
