"""What the bench times, one module per family of cases (see attnres_ge.bench), and the registry of their named
shapes. A case holds one shape's inputs and gives, per provider, a call per direction (`provider(name)`), with
`directions`, `dtype`, `copy_elements()` (the paired copy's size), `provider_traffic(direction, provider)` (the
minimum traffic in bytes) and `path(provider)` (what runs its kernels), which harness.measure_case times."""
