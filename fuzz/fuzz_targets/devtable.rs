//! genext2fs device tables (`mkfs -D FILE`): read and checked, then applied to a small image.
//! No panic, no hang, bounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use uext4::blockdev::MemDevice;
use uext4::Fs;
use uext4_cli::tools::devtable;
use uext4_fuzz::{empty_image, input_file, quiet_rw};

fuzz_target!(|data: &[u8]| {
    let table = input_file("devtable", data);
    let Ok(lines) = devtable::read(&table) else {
        return;
    };
    let dev = Arc::new(MemDevice::from_vec(empty_image().to_vec()));
    let fs = Fs::open_dev(dev, quiet_rw()).expect("the empty image opens");
    let _ = devtable::apply(&fs, &table, &lines);
    let _ = fs.unmount();
});
