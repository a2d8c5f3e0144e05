//! Unit tests of the block devices: the overlay and the region view.

mod overlay;
mod region;
