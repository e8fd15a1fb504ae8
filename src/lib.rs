pub use dfdx;
