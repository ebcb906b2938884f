//! Adversarial cases for `mmobject::track`.
