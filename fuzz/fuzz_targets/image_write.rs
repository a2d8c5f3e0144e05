//! The write path on a mutated image: open read-write (orphans processed, a journal
//! replayed), create, write, rename, remove, truncate, punch and set xattrs, then unmount.
//! No panic, no hang, bounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use uext4::blockdev::MemDevice;
use uext4::Fs;
use uext4_fuzz::{image_seeds, mutated_image, operate, quiet_rw, walk};

fuzz_target!(|data: &[u8]| {
    let mut u = arbitrary::Unstructured::new(data);
    let Some(img) = mutated_image(image_seeds(), &mut u) else {
        return;
    };
    let dev = Arc::new(MemDevice::from_vec(img));
    let Ok(fs) = Fs::open_dev(dev, quiet_rw()) else {
        return;
    };
    let _ = operate(&fs, &mut u);
    let _ = walk(&fs);
    let _ = fs.unmount();
});
