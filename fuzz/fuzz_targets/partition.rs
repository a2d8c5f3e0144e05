//! GPT and MBR partition tables (and what a device or partition holds): the input is the
//! start of a disk, padded to whole sectors. No panic, no hang, bounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use uext4::blockdev::{BlockDevice, MemDevice, RegionDevice};
use uext4::partition::{identify, identify_partition, image_format, Table};

fuzz_target!(|data: &[u8]| {
    let mut disk = data.to_vec();
    disk.resize(data.len().div_ceil(512).max(2) * 512, 0);
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_vec(disk));
    let _ = identify(&*dev);
    let _ = image_format(&*dev);
    if let Ok(Some(t)) = Table::read(&*dev) {
        let _ = t.summary();
        for n in 0..8 {
            if let Some(p) = t.get(n) {
                let _ = identify_partition(&dev, p);
                if let Ok(r) = t.region_of(n) {
                    if let Ok(part) = RegionDevice::new(dev.clone(), r) {
                        let mut b = [0u8; 512];
                        let _ = part.read_at(0, &mut b);
                    }
                }
            }
        }
    }
});
