//! Tar archives as `mkfs -d ARCHIVE` and `cp --from-tar` read them (plain, gzip, zstd; ustar,
//! GNU and PAX headers, sparse members, xattrs, hard links), unpacked into a small image, which
//! is then walked. No panic, no hang, bounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use uext4::blockdev::MemDevice;
use uext4::Fs;
use uext4_cli::tools::tar::Unpacker;
use uext4_fuzz::{empty_image, input_file, quiet_rw, walk};

fuzz_target!(|data: &[u8]| {
    let archive = input_file("archive.tar", data);
    let dev = Arc::new(MemDevice::from_vec(empty_image().to_vec()));
    let fs = Fs::open_dev(dev, quiet_rw()).expect("the empty image opens");
    let mut u = Unpacker::new(&fs, uext4::ROOT_INO);
    if u.unpack(&archive).is_ok() {
        let _ = u.finish();
    }
    let _ = walk(&fs);
    let _ = fs.unmount();
});
