//! Fashion-MNIST's format: its image size and classes, its files and where Debian installs them,
//! and the IDX magic numbers. A leaf: every other file of the crate may import it.

/// Height and width of every image, in pixels.
pub const IMAGE_SIDE: usize = 28;
/// Pixels per image (`28 * 28`); one byte each, 0 = background, 255 = full ink.
pub const IMAGE_SIZE: usize = IMAGE_SIDE * IMAGE_SIDE;
/// Number of classes; labels are `0..CLASSES`.
pub const CLASSES: usize = 10;
/// Human-readable class names, indexed by label.
pub const CLASS_NAMES: [&str; CLASSES] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// Where Debian's `dataset-fashion-mnist` package installs the full data set.
pub const SYSTEM_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// File name of the training images.
pub const TRAIN_IMAGES_FILE: &str = "train-images-idx3-ubyte.gz";
/// File name of the training labels.
pub const TRAIN_LABELS_FILE: &str = "train-labels-idx1-ubyte.gz";
/// File name of the test images.
pub const TEST_IMAGES_FILE: &str = "t10k-images-idx3-ubyte.gz";
/// File name of the test labels.
pub const TEST_LABELS_FILE: &str = "t10k-labels-idx1-ubyte.gz";

/// Magic number opening an IDX file of unsigned-byte, three-dimensional data (images).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number opening an IDX file of unsigned-byte, one-dimensional data (labels).
pub const LABELS_MAGIC: u32 = 0x0000_0801;
