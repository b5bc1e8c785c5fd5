// Package resnet lays out torchvision's ResNet-50 (v1.5: the stride on the
// 3x3 convolution of a bottleneck) for the examples' builders. It knows
// the architecture only: which ConvBN layers there are, in which order,
// of what shape and stride, and how they connect. Each builder makes the
// layers its own way (parameter names and stores, trainable or frozen
// BatchNorm) through the small Builder interface, so that Mask R-CNN's
// backbone and Deformable-DETR's are one description.
package resnet
