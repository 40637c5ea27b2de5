"""The Self-Attention GAN: `model` (registered as "sagan_generator" and
"sagan_discriminator")."""
