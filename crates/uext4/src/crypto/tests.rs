//! Tests of the fscrypt module.
