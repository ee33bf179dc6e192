"""What frameworks call instead of FUSE for files' bytes (issue 34; docs/design.md section 18):
`put` and `get` move a file's bytes to and from the mount's daemon in sealed memfds over its
bulk socket (`bulk`); `background` commits puts in a background thread; `torch_io`,
`dcp_storage` and `lightning_io` are the plug-ins for torch.save, torch.distributed.checkpoint
and Lightning. torch and lightning are imported only by those three, and only when used; the
daemon never imports this package."""
