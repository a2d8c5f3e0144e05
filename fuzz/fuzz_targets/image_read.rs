//! Open, walk and read a mutated image read-only: no panic, no hang, bounded memory, and not
//! one byte written.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uext4_fuzz::{has_mmp, image_seeds, mutate, read_only_walk};

fuzz_target!(|data: &[u8]| {
    let seeds = image_seeds();
    let mut u = arbitrary::Unstructured::new(data);
    let Ok(i) = u.choose_index(seeds.len()) else {
        return;
    };
    let Ok(img) = mutate(&seeds[i], &mut u) else {
        return;
    };
    if has_mmp(&img) {
        return;
    }
    read_only_walk(img);
});
