// The toy op ScaledAdd's kernel, compiled once per instruction set like every op's (z = x + alpha * y,
// one rounding per element as torch.add(x, y, alpha=alpha) on a CPU: alpha * y, then the sum).

void scaled_add_kernel(const ScaledAddArgs& args, int) {
  const int64_t count = args.tokens * args.hidden;
  for (int64_t i = 0; i < count; ++i) args.z[i] = args.x[i] + args.alpha * args.y[i];
}
