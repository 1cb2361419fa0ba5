"""`posenc bench`: what each encoding costs per training step on this machine (tokens/s, MFU,
peak memory), timing the very train_step `posenc train` runs, paired round by round with a plain
reference and with NoPE so that a busy machine moves both sides of a ratio."""
