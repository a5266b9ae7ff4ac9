"""Secrets and personal data never reach the store."""

import pytest

from kb.redact import redact

CASES = [
    ("mail ops-team@example.org now", "ops-team@example.org", "EMAIL"),
    ("master at 10.12.0.7:29500", "10.12.0.7", "IP"),
    ("peer fe80:0:0:0:200:f8ff:fe21:67cf down", "fe80:0:0:0:200:f8ff:fe21:67cf", "IP"),
    ("export WANDB_API_KEY=0123456789abcdef", "0123456789abcdef", "SECRET"),
    ("password: hunter22!", "hunter22!", "SECRET"),
    ("docker login -u bob -p Pa55word registry.io", "Pa55word", "SECRET"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "TOKEN"),
    ("HF hf_abcdefghijklmnopqrstuvwxyz12", "hf_abcdefghijklmnopqrstuvwxyz12", "TOKEN"),
    ("aws AKIAABCDEFGHIJKLMNOP key", "AKIAABCDEFGHIJKLMNOP", "AWS_KEY"),
    ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz123", "abcdefghijklmnopqrstuvwxyz123", "TOKEN"),
    ("clone https://bob:s3cr3t@git.example.com/r.git", "bob:s3cr3t", "URL_CREDENTIALS"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----",
     "b3BlbnNzaC1rZXk", "PRIVATE_KEY"),
]


@pytest.mark.parametrize("text,secret,label", CASES)
def test_secret_is_replaced(text, secret, label):
    out = redact(text)
    assert secret not in out
    assert f"[REDACTED:{label}]" in out


@pytest.mark.parametrize("text", [
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus.",
    "torch 2.13.0 with CUDA 12.4 and driver 550.54.15",
    "Exit Code: 137, Reason: OOMKilled",
    "NCCL_SOCKET_IFNAME=eth0 NCCL_IB_HCA=mlx5_0",
])
def test_log_lines_are_kept(text):
    assert redact(text) == text
