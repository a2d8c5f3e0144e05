//! Open, walk and read a mutated image read-only: no panic, no hang, bounded memory, and not
//! one byte written.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uext4_fuzz::{image_seeds, mutated_image, read_only_walk};

fuzz_target!(|data: &[u8]| {
    let mut u = arbitrary::Unstructured::new(data);
    let Some(img) = mutated_image(image_seeds(), &mut u) else {
        return;
    };
    read_only_walk(img);
});
