"""The paper's look inside a ViT (§4.5, Figures 6 and 7; Appendix D.7, D.8).

Pure functions, tensors in and arrays out; `plots.py` (with mpp_plot.py, sweep_plots.py and
overlay.py, the only matplotlib importers) draws them and `page.py` writes the HTML page. Attention
always comes from the model's own exact path (`model(x, return_intermediates=True)["attentions"]`), never from hooks.

    from vitlab import analysis
    out = model(x, return_intermediates=True)
    maps = analysis.attention_rollout(out["attentions"], out["grid"], model.num_prefix_tokens)
    dist = analysis.mean_attention_distance(out["attentions"], out["grid"], 16, 1)
"""

from vitlab.analysis.attention_distance import AttentionDistance, distance_depth_trend, mean_attention_distance, patch_distance_matrix
from vitlab.analysis.figure import Figure
from vitlab.analysis.filters import FilterPCs, embedding_filters, filter_principal_components
from vitlab.analysis.objective_figures import objective_figures
from vitlab.analysis.pos_similarity import NoPositionTable, cosine_similarity_grid, position_table, similarity_vs_distance
from vitlab.analysis.rollout import attention_rollout, rollout_matrix, upsample_map
from vitlab.analysis.summary import Analysis, analyse_model, display_images, pooled_draws

__all__ = [
    "Analysis",
    "AttentionDistance",
    "FilterPCs",
    "Figure",
    "NoPositionTable",
    "analyse_model",
    "attention_rollout",
    "cosine_similarity_grid",
    "display_images",
    "distance_depth_trend",
    "embedding_filters",
    "filter_principal_components",
    "objective_figures",
    "mean_attention_distance",
    "patch_distance_matrix",
    "pooled_draws",
    "position_table",
    "rollout_matrix",
    "similarity_vs_distance",
    "upsample_map",
]
