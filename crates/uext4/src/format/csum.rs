//! Checksums: crc32c as ext4 and jbd2 use it (no final inversion, seeded), and the crc16 of
//! the older gdt_csum feature.

/// The kernel's `crc32c(seed, data)`: the raw CRC register update, with neither the initial
/// nor the final inversion that the standard CRC-32C applies.
#[inline]
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// CRC-16 (ANSI, polynomial 0x8005 reflected), as e2fsprogs' `ext2fs_crc16`.
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc ^= b as u16;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xA001
            } else {
                crc >> 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests;
