"""Plain-PyTorch ResNet with torchvision's module tree, names and layout (no torchvision
import): the reference for tests/models/test_resnet.cpp and Brigade's models/resnet.

    ResNet(layers=[2, 2, 2, 2], bottleneck=False, num_classes=10, in_channels=1, width=64,
           small_input=True)

Matches torchvision.models.resnet.ResNet (BasicBlock / Bottleneck "v1.5", stride on the
3x3 conv; downsample = Sequential(conv1x1, BatchNorm2d)), with two options torchvision
lacks: `width` (channels of the stem and stage 1, 64 in torchvision) and `small_input`
(3x3 stride-1 stem conv and no max-pool, for 28x28 images). The state_dict keys are
torchvision's: conv1.weight, bn1.{weight,bias,running_mean,running_var,num_batches_tracked},
layer{k}.{j}.conv{i}.weight, layer{k}.{j}.bn{i}.*, layer{k}.0.downsample.{0,1}.*, fc.*.
Init as torchvision: kaiming_normal_(fan_out, relu) convs, BatchNorm 1/0, default Linear.
"""
import torch
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, 1, 0, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, 1, 0, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), bottleneck=False, num_classes=10, in_channels=1, width=64,
                 small_input=True):
        super().__init__()
        block = Bottleneck if bottleneck else BasicBlock
        self.inplanes = width
        if small_input:
            self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity() if small_input else nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, width, layers[0], 1)
        self.layer2 = self._make_layer(block, width * 2, layers[1], 2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], 2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def check_main():
    """python3 resnet_ref.py --model M.safetensors --batch B.safetensors
    M: a Brigade-saved state_dict (torchvision names) with metadata config = JSON of the
    ResNet arguments; B: images and the eval-mode logits Brigade computed. Loads M into
    this ResNet (strict: every key, no extra), runs the eval forward and exits 0 when the
    logits agree to 1e-5 relative (max-abs normalised), 1 otherwise."""
    import argparse
    import json
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import st_io
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    state, meta = st_io.load(args.model)
    m = ResNet(**json.loads(meta["config"]))
    m.load_state_dict(state, strict=True)
    m.eval()
    batch, _ = st_io.load(args.batch)
    with torch.no_grad():
        got = m(batch["images"])
    want = batch["logits"]
    err = ((got - want).abs().max() / want.abs().max()).item()
    print(f"torch eval logits vs Brigade: rel err {err:.3g}")
    sys.exit(0 if err < 1e-5 else 1)


if __name__ == "__main__":
    check_main()
