//! Bar charts as PNG files, with a small encoder of our own (stored deflate blocks: the images
//! are tiny, and a compression crate would be a dependency for a few kilobytes).

use std::io::Write;
use std::path::Path;

/// One color per system the harness knows (sixteen), so no two share one in a chart.
const PALETTE: [[u8; 3]; 16] = [
    [0x4e, 0x79, 0xa7],
    [0xf2, 0x8e, 0x2b],
    [0xe1, 0x57, 0x59],
    [0x76, 0xb7, 0xb2],
    [0x59, 0xa1, 0x4f],
    [0xed, 0xc9, 0x48],
    [0xb0, 0x7a, 0xa1],
    [0xff, 0x9d, 0xa7],
    [0x9c, 0x75, 0x5f],
    [0xba, 0xb0, 0xac],
    [0x1f, 0x3a, 0x5f],
    [0x8c, 0x2d, 0x04],
    [0x2c, 0xa0, 0x2c],
    [0x7f, 0x7f, 0x7f],
    [0x17, 0xbe, 0xcf],
    [0x94, 0x67, 0xbd],
];

/// The color of the i-th system in a chart (for the report's legend).
pub fn color_name(i: usize) -> String {
    let c = PALETTE[i % PALETTE.len()];
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut c = kind.to_vec();
    c.extend_from_slice(data);
    out.extend_from_slice(&c);
    out.extend_from_slice(&crc32(&c).to_be_bytes());
}

fn encode(w: u32, h: u32, rgb: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity((w * 3 + 1) as usize * h as usize);
    for row in rgb.chunks(w as usize * 3) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push((i + 1 == blocks.len()) as u8);
        z.extend_from_slice(&(b.len() as u16).to_le_bytes());
        z.extend_from_slice(&(!(b.len() as u16)).to_le_bytes());
        z.extend_from_slice(b);
    }
    let (mut a, mut bsum) = (1u32, 0u32);
    for &x in &raw {
        a = (a + x as u32) % 65521;
        bsum = (bsum + a) % 65521;
    }
    z.extend_from_slice(&((bsum << 16) | a).to_be_bytes());
    let mut out = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// One group of bars per system (its job sweep, left to right), heights on a linear scale.
pub fn bar_chart(path: &Path, groups: &[Vec<f64>]) -> std::io::Result<()> {
    let bars: usize = groups.iter().map(|g| g.len()).sum();
    let (bw, gap, pad, h) = (12u32, 10u32, 20u32, 240u32);
    let w = pad * 2 + bars as u32 * bw + groups.len() as u32 * gap;
    let mut img = vec![0xffu8; (w * h * 3) as usize];
    let max = groups
        .iter()
        .flatten()
        .cloned()
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let mut put = |x: u32, y: u32, c: [u8; 3]| {
        if x < w && y < h {
            let i = ((y * w + x) * 3) as usize;
            img[i..i + 3].copy_from_slice(&c);
        }
    };
    for x in pad / 2..w - pad / 2 {
        put(x, h - pad, [0x80, 0x80, 0x80]);
    }
    let mut x = pad;
    for (gi, g) in groups.iter().enumerate() {
        let c = PALETTE[gi % PALETTE.len()];
        for &v in g {
            let bh = ((v / max) * (h - 2 * pad) as f64).round() as u32;
            for dx in 1..bw - 1 {
                for y in (h - pad - bh)..(h - pad) {
                    put(x + dx, y, c);
                }
            }
            x += bw;
        }
        x += gap;
    }
    std::fs::File::create(path)?.write_all(&encode(w, h, &img))
}
