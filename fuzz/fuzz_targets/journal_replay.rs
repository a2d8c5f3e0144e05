//! Journal replay of a mutated journal (descriptor, revoke and commit blocks, the journal
//! superblock, the ext4 superblock's journal fields): read-only (replayed into memory: not one
//! byte of the image written), then read-write (replayed onto the image), each followed by a
//! walk. No panic, no hang, bounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use uext4::blockdev::MemDevice;
use uext4::Fs;
use uext4_fuzz::{journal_seeds, mutated_image, quiet_rw, read_only_walk, walk};

fuzz_target!(|data: &[u8]| {
    let mut u = arbitrary::Unstructured::new(data);
    let Some(img) = mutated_image(journal_seeds(), &mut u) else {
        return;
    };
    read_only_walk(img.clone());
    let dev = Arc::new(MemDevice::from_vec(img));
    if let Ok(fs) = Fs::open_dev(dev, quiet_rw()) {
        let _ = walk(&fs);
        let _ = fs.unmount();
    }
});
