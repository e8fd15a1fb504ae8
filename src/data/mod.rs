//! Data sets for examples and the main job.
