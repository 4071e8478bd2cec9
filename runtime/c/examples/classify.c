/* classify: load a bundle, feed a raw RGB image, print the top-k classes.
 *
 *   classify MODEL.mlc IMAGE.rgb WIDTH HEIGHT [K]
 *
 * IMAGE.rgb holds WIDTH x HEIGHT pixels of 3 bytes (R, G, B), row by row (e.g.
 * `convert photo.png -depth 8 rgb:photo.rgb`). The image is fitted to the model's one input
 * (N, C, H, W) float32 by nearest-neighbour sampling: C = 3 takes R, G, B scaled to [0, 1];
 * C = 1 takes the luma, likewise; a (1, F) input takes the luma image of F = H * W pixels
 * (a square side). Prints "rank class score" lines for the first output, best first. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlcrt.h"

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: classify MODEL.mlc IMAGE.rgb WIDTH HEIGHT [K]\n");
        return 2;
    }
    long w = strtol(argv[3], NULL, 10), h = strtol(argv[4], NULL, 10);
    long k = argc > 5 ? strtol(argv[5], NULL, 10) : 5;
    if (w < 1 || h < 1 || w > 1 << 15 || h > 1 << 15 || k < 1) {
        fprintf(stderr, "error: WIDTH, HEIGHT and K must be positive\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    size_t size = (size_t)w * (size_t)h * 3;
    unsigned char *rgb = malloc(size);
    if (!f || !rgb || fread(rgb, 1, size, f) != size) {
        fprintf(stderr, "error: %s: cannot read %zu bytes of RGB\n", argv[2], size);
        if (f)
            fclose(f);
        free(rgb);
        return 7;
    }
    fclose(f);

    mlc_options options;
    mlc_options_init(&options);
    mlc_model *model;
    mlc_error err;
    mlc_status status = mlc_open_file(argv[1], &options, &model, &err);
    if (status != MLC_OK) {
        fprintf(stderr, "error: %s\n", err.message);
        free(rgb);
        return (int)status;
    }
    mlc_tensor_info in_info, out_info;
    mlc_input_info(model, 0, &in_info);
    mlc_output_info(model, 0, &out_info);

    /* the input tensor: (N, C, H, W) or (N, F), batch 1 */
    mlc_tensor input = {0};
    input.dtype = MLC_FLOAT32;
    input.ndim = in_info.ndim;
    memcpy(input.dims, in_info.dims, sizeof input.dims);
    input.dims[0] = 1;
    long channels = 1, ih, iw;
    if (in_info.ndim == 4) {
        channels = (long)input.dims[1];
        ih = (long)input.dims[2];
        iw = (long)input.dims[3];
    } else {
        ih = iw = (long)sqrt((double)input.dims[in_info.ndim - 1]);
    }
    input.nbytes = (size_t)channels * (size_t)ih * (size_t)iw * sizeof(float);
    float *x = calloc(1, input.nbytes);
    input.data = x;
    for (long c = 0; c < channels; c++)
        for (long y = 0; y < ih; y++)
            for (long xx = 0; xx < iw; xx++) {
                const unsigned char *p = rgb + 3 * ((y * h / ih) * w + xx * w / iw);
                float v = channels == 3 ? p[c] / 255.0f
                                        : (0.299f * p[0] + 0.587f * p[1] + 0.114f * p[2]) / 255.0f;
                x[(c * ih + y) * iw + xx] = v;
            }

    size_t nout = mlc_output_count(model);
    mlc_tensor *outputs = calloc(nout, sizeof *outputs);
    for (size_t i = 0; i < nout; i++) {
        mlc_output_nbytes(model, i, &input, 1, &outputs[i].nbytes, &err);
        outputs[i].data = malloc(outputs[i].nbytes);
    }
    status = mlc_run(model, &input, 1, outputs, nout, &err);
    if (status != MLC_OK) {
        fprintf(stderr, "error: %s\n", err.message);
    } else {
        const float *scores = outputs[0].data;
        size_t classes = outputs[0].nbytes / sizeof(float);
        printf("%s: %s\n", argv[1], out_info.name);
        for (long r = 0; r < k && (size_t)r < classes; r++) {
            size_t best = 0;
            for (size_t c = 1; c < classes; c++)
                if (scores[c] > scores[best])
                    best = c;
            printf("%ld %zu %.9g\n", r + 1, best, scores[best]);
            ((float *)outputs[0].data)[best] = -INFINITY;
        }
    }
    for (size_t i = 0; i < nout; i++)
        free(outputs[i].data);
    free(outputs);
    free(x);
    free(rgb);
    mlc_close(model);
    return (int)status;
}
