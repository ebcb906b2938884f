//! Adversarial cases for the object layer: handles, stores and the manager.
