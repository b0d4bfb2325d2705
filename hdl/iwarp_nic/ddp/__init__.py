"""DDP (RFC 5041) with the RDMAP header decode it carries (RFC 5040, RFC 7306): segments parsed
and emitted, and the tagged-buffer checks of RFC 5041 and RFC 5042 before placement."""
