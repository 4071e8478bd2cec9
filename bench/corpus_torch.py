"""The corpus's torch-built models: architectures that real exported models use and that the
package-shipped ONNX files do not cover (U-Net, GAN upsampler, ViT/DeiT, BERT, CRNN, speech,
3-D conv, MobileNetV3, EfficientNet, YOLOX neck, InstanceNorm/GroupNorm nets, ConvNeXt,
MLP-Mixer). Written out in torch (torchvision and timm are not dependencies), sized to export in
seconds and stay under ~40 MB. Each builder returns ``(module, example inputs)``; bench/corpus.py
seeds the weights, randomizes normalization statistics and exports to ONNX (opset 17)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def _cbr(cin: int, cout: int, k: int = 3, stride: int = 1, act: type = nn.ReLU,
         groups: int = 1) -> nn.Sequential:
    """Conv, BatchNorm, activation: the block most CNNs are made of."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), act())


# ---- U-Net (Ronneberger et al. 2015): skip concatenations, ConvTranspose upsampling -------------

class UNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64, 128), classes: int = 2) -> None:
        super().__init__()
        self.down = nn.ModuleList()
        cin = 3
        for w in widths:
            self.down.append(nn.Sequential(_cbr(cin, w), _cbr(w, w)))
            cin = w
        self.up = nn.ModuleList()
        self.merge = nn.ModuleList()
        for w in reversed(widths[:-1]):
            self.up.append(nn.ConvTranspose2d(cin, w, 2, 2))
            self.merge.append(nn.Sequential(_cbr(2 * w, w), _cbr(w, w)))
            cin = w
        self.head = nn.Conv2d(cin, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips[:-1])):
            x = merge(torch.cat([up(x), skip], 1))
        return self.head(x)


def unet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return UNet(), (torch.rand(1, 3, 128, 128),)


# ---- GAN generator / super-resolution upsampler --------------------------------------------------

class GanUpsampler(nn.Module):
    """DCGAN-style ConvTranspose(4, 2, 1) stack, then a nearest and a bilinear Resize, each
    followed by a 3x3 conv (the checkerboard-free upsampling of Odena et al.), Tanh output."""

    def __init__(self) -> None:
        super().__init__()
        self.deconv = nn.Sequential(
            nn.ConvTranspose2d(64, 128, 4, 2, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU(),
            nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.conv_nearest = _cbr(64, 32)
        self.conv_linear = _cbr(32, 16)
        self.out = nn.Conv2d(16, 3, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.deconv(z)
        x = self.conv_nearest(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        x = self.conv_linear(F.interpolate(x, scale_factor=2.0, mode="bilinear",
                                           align_corners=False))
        return torch.tanh(self.out(x))


def gan_upsampler() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return GanUpsampler(), (torch.randn(1, 64, 16, 16),)


# ---- Transformers: ViT encoder + saliency decoder, DeiT-tiny, BERT --------------------------------

class Attention(nn.Module):
    """Multi-head self-attention written as timm writes it: one qkv Linear, batched matmuls
    over heads, softmax, an optional additive mask."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        if mask is not None:
            scores = scores + mask
        out = scores.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class EncoderBlock(nn.Module):
    """Pre-norm transformer block (ViT/DeiT); post-norm when ``post_norm`` (BERT)."""

    def __init__(self, dim: int, heads: int, mlp: int, post_norm: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))
        self.post_norm = post_norm

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.post_norm:
            x = self.norm1(x + self.attn(x, mask))
            return self.norm2(x + self.mlp(x))
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))


class ViTSaliency(nn.Module):
    """ViT-S/16-shaped encoder (dim 384, 6 heads; 4 layers to stay under 40 MB) and a saliency
    decoder: three ConvTranspose(4, 2, 1) + BatchNorm + ReLU stages, a 1x1 conv, a bilinear
    Resize back to the input size, Sigmoid."""

    def __init__(self, dim: int = 384, depth: int = 4, heads: int = 6, size: int = 224) -> None:
        super().__init__()
        self.grid = size // 16
        self.patch = nn.Conv2d(3, dim, 16, 16)
        self.pos = nn.Parameter(torch.randn(1, self.grid * self.grid, dim) * 0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(dim, heads, 4 * dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        stages: list[nn.Module] = []
        for cin, cout in ((dim, 128), (128, 64), (64, 32)):
            stages += [nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False), nn.BatchNorm2d(cout),
                       nn.ReLU()]
        self.decoder = nn.Sequential(*stages, nn.Conv2d(32, 1, 1))
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        t = self.norm(self.blocks(t))
        fmap = t.transpose(1, 2).reshape(x.shape[0], -1, self.grid, self.grid)
        sal = F.interpolate(self.decoder(fmap), size=(self.size, self.size), mode="bilinear",
                            align_corners=False)
        return torch.sigmoid(sal)


def vit_saliency() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return ViTSaliency(), (torch.rand(1, 3, 224, 224),)


class DeiTTiny(nn.Module):
    """DeiT-tiny (Touvron et al. 2021): dim 192, 3 heads, 12 layers, class and distillation
    tokens, two heads averaged."""

    def __init__(self, dim: int = 192, depth: int = 12, heads: int = 3, classes: int = 1000
                 ) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 16, 16)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.dist = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 196 + 2, dim) * 0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(dim, heads, 4 * dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.head_dist = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        b = t.shape[0]
        t = torch.cat([self.cls.expand(b, -1, -1), self.dist.expand(b, -1, -1), t], 1) + self.pos
        t = self.norm(self.blocks(t))
        return (self.head(t[:, 0]) + self.head_dist(t[:, 1])) / 2


def deit_tiny() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return DeiTTiny(), (torch.rand(1, 3, 224, 224),)


class Bert(nn.Module):
    """BERT-style encoder: word + position + token-type embeddings (Gather), LayerNorm,
    post-norm blocks with an additive attention mask from the int64 mask input, a tanh pooler."""

    def __init__(self, vocab: int = 8000, seq: int = 128, dim: int = 256, depth: int = 4,
                 heads: int = 4) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq, dim)
        self.types = nn.Embedding(2, dim)
        self.norm = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList([EncoderBlock(dim, heads, 4 * dim, post_norm=True)
                                     for _ in range(depth)])
        self.pool = nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.norm(self.words(ids) + self.positions(pos) + self.types(torch.zeros_like(ids)))
        additive = (1.0 - mask[:, None, None, :].to(torch.float32)) * -10000.0
        for block in self.blocks:
            x = block(x, additive)
        return x, torch.tanh(self.pool(x[:, 0]))


def bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    ids = torch.randint(0, 8000, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.int64)
    mask[:, 100:] = 0
    return Bert(), (ids, mask)


# ---- Recurrent: CRNN text recognizer, speech model -----------------------------------------------

class CRNN(nn.Module):
    """CRNN (Shi et al. 2015): a VGG-ish conv stack that pools height to 1, a 2-layer
    bidirectional LSTM over the width, a per-step classifier with log-softmax (CTC-style)."""

    def __init__(self, classes: int = 37, hidden: int = 128) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            _cbr(1, 32), nn.MaxPool2d(2, 2), _cbr(32, 64), nn.MaxPool2d(2, 2),
            _cbr(64, 128), _cbr(128, 128), nn.MaxPool2d((2, 1), (2, 1)),
            _cbr(128, 256), nn.MaxPool2d((4, 1), (4, 1)))
        self.rnn = nn.LSTM(256, hidden, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.convs(x).squeeze(2).permute(2, 0, 1)  # (width, batch, channels)
        y, _ = self.rnn(f)
        return self.fc(y).log_softmax(-1)


def crnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return CRNN(), (torch.rand(1, 1, 32, 128),)


class SpeechCommands(nn.Module):
    """Keyword spotter on raw audio: an STFT as a Conv1d with a fixed Hann-windowed DFT basis
    (n_fft 400, hop 160), power, a fixed mel-like filterbank as a 1x1 Conv1d, log, a 2-layer GRU,
    a linear classifier on the last step."""

    def __init__(self, n_fft: int = 400, hop: int = 160, mels: int = 64, hidden: int = 128,
                 classes: int = 35) -> None:
        super().__init__()
        bins = n_fft // 2 + 1
        t = torch.arange(n_fft, dtype=torch.float64)
        k = torch.arange(bins, dtype=torch.float64)[:, None]
        window = 0.5 - 0.5 * torch.cos(2 * math.pi * t / n_fft)
        basis = torch.cat([torch.cos(2 * math.pi * k * t / n_fft),
                           -torch.sin(2 * math.pi * k * t / n_fft)]) * window
        self.stft = nn.Conv1d(1, 2 * bins, n_fft, hop, bias=False)
        self.stft.weight.data = basis.float()[:, None, :]
        self.stft.weight.requires_grad_(False)
        centers = torch.linspace(0, bins - 1, mels + 2)
        fb = (1 - (k.float().T - centers[1:-1, None]).abs() / (centers[1] - centers[0])).clamp(0)
        self.mel = nn.Conv1d(bins, mels, 1, bias=False)
        self.mel.weight.data = fb[:, :, None]
        self.bins = bins
        self.gru = nn.GRU(mels, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        spec = self.stft(wave.unsqueeze(1))
        re, im = spec[:, :self.bins], spec[:, self.bins:]
        logmel = torch.log(self.mel(re * re + im * im) + 1e-6)
        y, _ = self.gru(logmel.transpose(1, 2))
        return self.fc(y[:, -1])


def speech() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return SpeechCommands(), (0.1 * torch.randn(1, 16000),)


# ---- 3-D convolutions (C3D / R3D-style video classifier) -----------------------------------------

class Video3D(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv3d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm3d(cout), nn.ReLU()]

        self.features = nn.Sequential(
            *block(3, 16), nn.MaxPool3d((1, 2, 2)), *block(16, 32), nn.MaxPool3d(2),
            *block(32, 64), nn.AvgPool3d(2), *block(64, 64))
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3, 4)))


def conv3d() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return Video3D(), (torch.rand(1, 3, 8, 64, 64),)


# ---- MobileNetV3-small, EfficientNet-B0 ----------------------------------------------------------

class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int, act: type = nn.ReLU,
                 gate: type = nn.Hardsigmoid) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(squeeze, c, 1)
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


class InvertedResidual(nn.Module):
    """MobileNetV3 bneck / EfficientNet MBConv: 1x1 expand, depthwise k x k, SE, 1x1 project."""

    def __init__(self, cin: int, exp: int, cout: int, k: int, stride: int, se: bool,
                 act: type, se_squeeze: int, se_act: type, se_gate: type) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(_cbr(cin, exp, 1, act=act))
        layers.append(_cbr(exp, exp, k, stride, act=act, groups=exp))
        if se:
            layers.append(SqueezeExcite(exp, se_squeeze, se_act, se_gate))
        layers += [nn.Conv2d(exp, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


# (kernel, expansion, out, SE, HardSwish, stride): Howard et al. 2019, table 2.
_MBV3_SMALL = ((3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2),
               (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2),
               (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
               (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1),
               (5, 288, 96, True, True, 2), (5, 576, 96, True, True, 1),
               (5, 576, 96, True, True, 1))


class MobileNetV3Small(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_cbr(3, 16, 3, 2, act=nn.Hardswish)]
        cin = 16
        for k, exp, cout, se, hs, stride in _MBV3_SMALL:
            layers.append(InvertedResidual(cin, exp, cout, k, stride, se,
                                           nn.Hardswish if hs else nn.ReLU,
                                           _divisible(exp // 4), nn.ReLU, nn.Hardsigmoid))
            cin = cout
        layers.append(_cbr(cin, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def _divisible(v: float, d: int = 8) -> int:
    return max(d, int(v + d / 2) // d * d)


def mobilenet_v3_small() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return MobileNetV3Small(), (torch.rand(1, 3, 224, 224),)


# (expansion, out, repeats, stride, kernel): Tan & Le 2019, table 1.
_EFFNET_B0 = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3),
              (6, 112, 3, 1, 5), (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))


class EfficientNetB0(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_cbr(3, 32, 3, 2, act=nn.SiLU)]
        cin = 32
        for exp, cout, repeats, stride, k in _EFFNET_B0:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cin * exp, cout, k, stride if i == 0 else 1,
                                               True, nn.SiLU, max(1, cin // 4), nn.SiLU,
                                               nn.Sigmoid))
                cin = cout
        layers.append(_cbr(cin, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def efficientnet_b0() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return EfficientNetB0(), (torch.rand(1, 3, 224, 224),)


# ---- YOLOX-ish detector: Focus slices, CSP blocks, PAN neck (SiLU, nearest Resize, Concat) -------

class CSP(nn.Module):
    """CSP bottleneck (YOLOv5's C3): two 1x1 branches, bottlenecks on one, Concat, 1x1."""

    def __init__(self, cin: int, cout: int, n: int = 1) -> None:
        super().__init__()
        h = cout // 2
        self.a = _cbr(cin, h, 1, act=nn.SiLU)
        self.b = _cbr(cin, h, 1, act=nn.SiLU)
        self.m = nn.Sequential(*[nn.Sequential(_cbr(h, h, 1, act=nn.SiLU),
                                               _cbr(h, h, 3, act=nn.SiLU)) for _ in range(n)])
        self.out = _cbr(2 * h, cout, 1, act=nn.SiLU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([self.m(self.a(x)), self.b(x)], 1))


class YoloxNeck(nn.Module):
    def __init__(self, w: int = 16, classes: int = 80) -> None:
        super().__init__()
        self.stem = _cbr(12, w, 3, act=nn.SiLU)
        self.d2 = nn.Sequential(_cbr(w, 2 * w, 3, 2, act=nn.SiLU), CSP(2 * w, 2 * w))
        self.d3 = nn.Sequential(_cbr(2 * w, 4 * w, 3, 2, act=nn.SiLU), CSP(4 * w, 4 * w, 2))
        self.d4 = nn.Sequential(_cbr(4 * w, 8 * w, 3, 2, act=nn.SiLU), CSP(8 * w, 8 * w, 2))
        self.d5 = nn.Sequential(_cbr(8 * w, 16 * w, 3, 2, act=nn.SiLU), CSP(16 * w, 16 * w))
        self.lat5 = _cbr(16 * w, 8 * w, 1, act=nn.SiLU)
        self.td4 = CSP(16 * w, 8 * w)
        self.lat4 = _cbr(8 * w, 4 * w, 1, act=nn.SiLU)
        self.td3 = CSP(8 * w, 4 * w)
        self.bu3 = _cbr(4 * w, 4 * w, 3, 2, act=nn.SiLU)
        self.pan4 = CSP(8 * w, 8 * w)
        self.bu4 = _cbr(8 * w, 8 * w, 3, 2, act=nn.SiLU)
        self.pan5 = CSP(16 * w, 16 * w)
        self.heads = nn.ModuleList([nn.Conv2d(c, 5 + classes, 1) for c in (4 * w, 8 * w, 16 * w)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Focus: four strided slices stacked on channels (Slice with steps, Concat).
        x = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2],
                       x[..., 1::2, 1::2]], 1)
        c3 = self.d3(self.d2(self.stem(x)))
        c4 = self.d4(c3)
        c5 = self.d5(c4)
        p5 = self.lat5(c5)
        p4 = self.td4(torch.cat([F.interpolate(p5, scale_factor=2.0, mode="nearest"), c4], 1))
        p4l = self.lat4(p4)
        p3 = self.td3(torch.cat([F.interpolate(p4l, scale_factor=2.0, mode="nearest"), c3], 1))
        n4 = self.pan4(torch.cat([self.bu3(p3), p4l], 1))
        n5 = self.pan5(torch.cat([self.bu4(n4), p5], 1))
        outs = [head(f).flatten(2) for head, f in zip(self.heads, (p3, n4, n5))]
        out = torch.cat(outs, 2).transpose(1, 2)
        return torch.cat([out[..., :4], out[..., 4:].sigmoid()], -1)


def yolox_neck() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return YoloxNeck(), (torch.rand(1, 3, 320, 320),)


# ---- Normalization-heavy nets: style transfer (InstanceNorm), GroupNorm residual net ---------------

class StyleTransfer(nn.Module):
    """Johnson et al. 2016 transformer net (reduced widths): ReflectionPad + Conv + InstanceNorm
    + ReLU, residual blocks, nearest-upsample convs back to full size."""

    def __init__(self) -> None:
        super().__init__()

        def conv(cin: int, cout: int, k: int, stride: int = 1) -> list[nn.Module]:
            return [nn.ReflectionPad2d(k // 2), nn.Conv2d(cin, cout, k, stride),
                    nn.InstanceNorm2d(cout, affine=True)]

        self.down = nn.Sequential(*conv(3, 16, 9), nn.ReLU(), *conv(16, 32, 3, 2), nn.ReLU(),
                                  *conv(32, 64, 3, 2), nn.ReLU())
        self.res = nn.ModuleList([nn.Sequential(*conv(64, 64, 3), nn.ReLU(), *conv(64, 64, 3))
                                  for _ in range(3)])
        self.up1 = nn.Sequential(*conv(64, 32, 3), nn.ReLU())
        self.up2 = nn.Sequential(*conv(32, 16, 3), nn.ReLU())
        self.out = nn.Sequential(nn.ReflectionPad2d(4), nn.Conv2d(16, 3, 9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(x)
        for block in self.res:
            y = y + block(y)
        y = self.up1(F.interpolate(y, scale_factor=2.0, mode="nearest"))
        y = self.up2(F.interpolate(y, scale_factor=2.0, mode="nearest"))
        return self.out(y)


def style_transfer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return StyleTransfer(), (torch.rand(1, 3, 128, 128),)


class GroupNormResNet(nn.Module):
    """Residual blocks as diffusion U-Nets write them: GroupNorm(8) + SiLU + Conv, twice, a
    1x1 skip where widths change, a strided conv down, a global-pool classifier."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, 1, 1)
        blocks: list[nn.Module] = []
        cin = widths[0]
        for i, w in enumerate(widths):
            blocks.append(GNBlock(cin, w))
            if i < len(widths) - 1:
                blocks.append(nn.Conv2d(w, w, 3, 2, 1))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.GroupNorm(8, cin)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.silu(self.norm(self.blocks(self.stem(x))))
        return self.fc(y.mean((2, 3)))


class GNBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.GroupNorm(8, cin), nn.SiLU(), nn.Conv2d(cin, cout, 3, 1, 1),
                                  nn.GroupNorm(8, cout), nn.SiLU(), nn.Conv2d(cout, cout, 3, 1, 1))
        self.skip = nn.Identity() if cin == cout else nn.Conv2d(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.skip(x) + self.body(x)


def groupnorm_resnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return GroupNormResNet(), (torch.rand(1, 3, 64, 64),)


# ---- ConvNeXt-atto, MLP-Mixer ---------------------------------------------------------------------

class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over channels of an NCHW map (ConvNeXt's downsampling layers)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, 1, 3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1 = nn.Linear(dim, 4 * dim)
        self.pw2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.gamma * self.pw2(F.gelu(self.pw1(y)))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtAtto(nn.Module):
    """ConvNeXt (Liu et al. 2022) at the 'atto' size: dims 40-320, depths 2-2-6-2."""

    def __init__(self, dims: tuple[int, ...] = (40, 80, 160, 320),
                 depths: tuple[int, ...] = (2, 2, 6, 2), classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0])]
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            if i:
                layers += [LayerNorm2d(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1])
        self.fc = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.features(x).mean((2, 3))))


def convnext_atto() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return ConvNeXtAtto(), (torch.rand(1, 3, 224, 224),)


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int, token_mlp: int, channel_mlp: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token = nn.Sequential(nn.Linear(tokens, token_mlp), nn.GELU(),
                                   nn.Linear(token_mlp, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel = nn.Sequential(nn.Linear(dim, channel_mlp), nn.GELU(),
                                     nn.Linear(channel_mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel(self.norm2(x))


class MlpMixer(nn.Module):
    """MLP-Mixer (Tolstikhin et al. 2021), reduced: patch 16 on 224 (196 tokens), dim 256,
    6 layers, token MLP 128, channel MLP 1024."""

    def __init__(self, dim: int = 256, depth: int = 6, classes: int = 1000) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 16, 16)
        self.blocks = nn.Sequential(*[MixerBlock(196, dim, 128, 4 * dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.blocks(self.patch(x).flatten(2).transpose(1, 2))
        return self.fc(self.norm(t).mean(1))


def mlp_mixer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return MlpMixer(), (torch.rand(1, 3, 224, 224),)


BUILDERS = {
    "unet": unet, "gan_upsampler": gan_upsampler, "vit_saliency": vit_saliency,
    "deit_tiny": deit_tiny, "bert": bert, "crnn": crnn, "speech_gru": speech,
    "conv3d": conv3d, "mobilenet_v3_small": mobilenet_v3_small,
    "efficientnet_b0": efficientnet_b0, "yolox_neck": yolox_neck,
    "style_transfer": style_transfer, "groupnorm_resnet": groupnorm_resnet,
    "convnext_atto": convnext_atto, "mlp_mixer": mlp_mixer,
}


def export(name: str, path: str, input_names: list[str], output_names: list[str]) -> None:
    """Build ``name`` under seed 0 (normalization statistics and affine parameters randomized so
    that folding them matters), in eval mode, and write it to ONNX ``path`` (opset 17, the
    TorchScript exporter, fixed shapes)."""
    torch.manual_seed(0)
    net, args = BUILDERS[name]()
    for m in net.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm3d)):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
        if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm, nn.InstanceNorm2d,
                          nn.LayerNorm)) and m.weight is not None:
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    net.eval()
    with torch.no_grad():
        torch.onnx.export(net, args, path, input_names=input_names, output_names=output_names,
                          opset_version=17, dynamo=False)
