//! Adversarial cases for `mmobject::alloc`.
