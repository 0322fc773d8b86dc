# Probe: the conv2d row's backward written as forward convolutions (cuDNN forward algos), timed.
import torch, torch.nn.functional as F
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(1)
x = torch.rand(128, 128, 16, 16, device=dev, generator=g) * 2 - 1
w = (torch.rand(128, 128, 3, 3, device=dev, generator=g) * 2 - 1) * 0.1
dy = torch.rand(128, 128, 16, 16, device=dev, generator=g) * 2 - 1

def t(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) * 1000)
    ts.sort(); return ts[len(ts) // 2]

wf = w.flip(2, 3).transpose(0, 1).contiguous()
for bench in (False, True):
    torch.backends.cudnn.benchmark = bench
    print("benchmark", bench)
    print("  fwd            %.0f" % t(lambda: F.conv2d(x, w, padding=1)))
    print("  dgrad (cudnn)  %.0f" % t(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, False, False])))
    print("  wgrad (cudnn)  %.0f" % t(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])))
    print("  dx as fwd conv %.0f" % t(lambda: F.conv2d(dy, wf, padding=1)))
    xt, dyt = x.transpose(0, 1).contiguous(), dy.transpose(0, 1).contiguous()
    print("  dw as fwd conv %.0f" % t(lambda: F.conv2d(xt, dyt, padding=1)))
    print("  transposes     %.0f" % t(lambda: (x.transpose(0, 1).contiguous(), dy.transpose(0, 1).contiguous())))
dx_ref = torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
print("dx max diff", (F.conv2d(dy, wf, padding=1) - dx_ref[0]).abs().max().item())
print("dw max diff", (F.conv2d(x.transpose(0, 1), dy.transpose(0, 1), padding=1).transpose(0, 1) - dx_ref[1]).abs().max().item())
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
    torch.backends.cudnn.benchmark = True
    for _ in range(3): F.conv2d(dy, wf, padding=1)
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8))
